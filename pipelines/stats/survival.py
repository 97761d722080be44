"""Survival figures: Harrell's C-index, cumulative/dynamic time-dependent AUC, Kaplan-Meier curves
and the log-rank test. `risk` is higher for an earlier event (a Cox model's linear predictor).

Conventions (those of lifelines, which the tests compare against):
- C-index: a pair is comparable when the earlier time is an event, or both times are equal and only
  one is an event (the censored case outlived the event); tied risks count one half.
- Time-dependent AUC at t: cases had the event by t, controls are still at risk after t; cases are
  weighted by the inverse probability of staying uncensored until their time (IPCW, Uno et al. 2007),
  estimated with Kaplan-Meier on the censoring times of the same cohort.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
from scipy.stats import chi2

from wsi.pipelines.stats import estimable
from wsi.pipelines.stats.bootstrap import percentile_interval, resamples

#: pairs compared per block in the C-index (bounds memory at about 100 MB for any cohort size)
_BLOCK = 2048


def concordance_index(time: np.ndarray, event: np.ndarray, risk: np.ndarray) -> float:
    """Harrell's C: the share of comparable pairs whose higher risk had the earlier event."""
    return concordance(time, event, risk)[0]


def comparable_pairs(time: np.ndarray, event: np.ndarray) -> int:
    """How many pairs Harrell's C compares (an event before another case's time): its resolution is
    1 / (2 pairs), so a handful of pairs gives a C-index that only jumps between 0, 0.5 and 1."""
    return concordance(time, event, np.zeros(len(np.asarray(time))))[1]


def concordance(time: np.ndarray, event: np.ndarray, risk: np.ndarray) -> tuple[float, int]:
    """(Harrell's C, the number of comparable pairs it rests on); C is NaN without a pair."""
    time, risk = np.asarray(time, dtype=np.float64), np.asarray(risk, dtype=np.float64)
    event = np.asarray(event).astype(bool)
    num = den = 0.0
    idx_events = np.flatnonzero(event)
    for start in range(0, len(idx_events), _BLOCK):
        i = idx_events[start : start + _BLOCK]
        t_i, r_i = time[i, None], risk[i, None]  # (b, 1)
        comparable = (time[None, :] > t_i) | ((time[None, :] == t_i) & ~event[None, :])  # (b, n)
        den += float(comparable.sum())
        num += float((comparable & (r_i > risk[None, :])).sum())
        num += 0.5 * float((comparable & (r_i == risk[None, :])).sum())
    return (num / den if den else math.nan), int(den)


@dataclass(frozen=True)
class KaplanMeier:
    """The product-limit estimate at each distinct time of the cohort (events and censorings)."""

    time: np.ndarray  # (m,) distinct times, increasing
    survival: np.ndarray  # (m,) S(t) just after each time
    at_risk: np.ndarray  # (m,) cases still followed just before each time
    events: np.ndarray  # (m,) events at each time
    censored: np.ndarray  # (m,) censorings at each time

    def at(self, t: float | np.ndarray, *, left: bool = False) -> np.ndarray:
        """S(t) (right-continuous), or its left limit S(t-) with `left`; 1 before the first time."""
        k = np.searchsorted(self.time, np.asarray(t, dtype=np.float64), side="left" if left else "right")
        return np.where(k > 0, self.survival[np.maximum(k - 1, 0)], 1.0)


def kaplan_meier(time: np.ndarray, event: np.ndarray) -> KaplanMeier:
    time = np.asarray(time, dtype=np.float64)
    event = np.asarray(event).astype(bool)
    distinct, inverse = np.unique(time, return_inverse=True)
    events = np.bincount(inverse, weights=event, minlength=len(distinct)).astype(np.int64)
    total = np.bincount(inverse, minlength=len(distinct)).astype(np.int64)
    at_risk = len(time) - np.concatenate([[0], np.cumsum(total)[:-1]]) if len(time) else total
    survival = np.cumprod(1.0 - events / np.maximum(at_risk, 1))
    return KaplanMeier(distinct, survival, at_risk, events, total - events)


def logrank_test(time: np.ndarray, event: np.ndarray, group: np.ndarray) -> tuple[float, float]:
    """Two-group log-rank test (group: bool, e.g. risk above the cut-off): (chi-square with 1 df, p)."""
    time = np.asarray(time, dtype=np.float64)
    event = np.asarray(event).astype(bool)
    group = np.asarray(group).astype(bool)
    if group.all() or not group.any():
        return math.nan, math.nan
    observed = expected = variance = 0.0
    for t in np.unique(time[event]):
        at_risk = time >= t
        n, n1 = int(at_risk.sum()), int((at_risk & group).sum())
        d = int((event & (time == t)).sum())
        d1 = int((event & (time == t) & group).sum())
        observed += d1
        expected += d * n1 / n
        if n > 1:
            variance += d * (n1 / n) * (1 - n1 / n) * (n - d) / (n - 1)
    if variance <= 0:
        return math.nan, math.nan
    stat = (observed - expected) ** 2 / variance
    return float(stat), float(chi2.sf(stat, 1))


def time_dependent_auc(
    time: np.ndarray, event: np.ndarray, risk: np.ndarray, horizons: np.ndarray
) -> np.ndarray:
    """Cumulative/dynamic AUC at each horizon (NaN where it has no case or no control)."""
    time, risk = np.asarray(time, dtype=np.float64), np.asarray(risk, dtype=np.float64)
    event = np.asarray(event).astype(bool)
    censoring = kaplan_meier(time, ~event)
    g = censoring.at(time, left=True)  # P(uncensored just before each case's own time)
    weight = np.where(event & (g > 0), 1.0 / np.where(g > 0, g, 1.0), 0.0)
    out = np.full(len(horizons), np.nan)
    for k, t in enumerate(np.asarray(horizons, dtype=np.float64)):
        cases = event & (time <= t)
        controls = time > t
        if not cases.any() or not controls.any():
            continue
        r_case, r_ctrl = risk[cases][:, None], risk[controls][None, :]  # (a, 1), (1, b)
        score = (r_case > r_ctrl).sum(1) + 0.5 * (r_case == r_ctrl).sum(1)  # (a,)
        w = weight[cases]
        out[k] = float((w * score).sum() / (w.sum() * controls.sum()))
    return out


def default_horizons(time: np.ndarray, event: np.ndarray) -> np.ndarray:
    """The quartiles of the event times: early, median and late horizons the cohort can answer."""
    times = np.asarray(time, dtype=np.float64)[np.asarray(event).astype(bool)]
    return np.unique(np.percentile(times, [25, 50, 75])) if len(times) else np.zeros(0)


class TdAucPoint(TypedDict):
    """One horizon of the time-dependent AUC in metrics.json (`td_auc`): None where not estimable."""

    time: float
    auc: float | None
    auc_ci95: list[float | None]  # [low, high]


def evaluate_survival(
    time: np.ndarray,
    event: np.ndarray,
    risk: np.ndarray,
    *,
    high_risk: np.ndarray | None,
    horizons: np.ndarray | None = None,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """C-index and time-dependent AUCs with 95% bootstrap intervals, and (given `high_risk` (n,) bool,
    e.g. risk above the training median) the log-rank test of high against low risk; cases with a
    missing label are dropped."""
    time, risk = np.asarray(time, dtype=np.float64), np.asarray(risk, dtype=np.float64)
    event = np.asarray(event, dtype=np.float64)
    keep = np.isfinite(time) & np.isfinite(event)
    time, event, risk = time[keep], event[keep].astype(bool), risk[keep]
    high = None if high_risk is None else np.asarray(high_risk, dtype=bool)[keep]
    hz = default_horizons(time, event) if horizons is None or not len(horizons) else np.asarray(horizons)
    c_draws, auc_draws = [], []
    for idx in resamples(len(time), n_resamples=n_bootstrap, seed=seed):
        c_draws.append(concordance_index(time[idx], event[idx], risk[idx]))
        auc_draws.append(time_dependent_auc(time[idx], event[idx], risk[idx], hz))
    auc_draws_arr = np.array(auc_draws).reshape(len(auc_draws), len(hz))  # (resamples, horizons)
    auc = time_dependent_auc(time, event, risk, hz)
    out: dict[str, Any] = {
        "n": len(time),
        "n_events": int(event.sum()),
        "c_index": concordance_index(time, event, risk),
        "c_index_ci95": list(percentile_interval(c_draws)),
        "td_auc": [
            TdAucPoint(time=float(t), auc=float(a), auc_ci95=list(percentile_interval(auc_draws_arr[:, k])))
            for k, (t, a) in enumerate(zip(hz, auc, strict=True))
        ],
    }
    if high is not None:
        stat, p = logrank_test(time, event, high)
        out.update({"n_high_risk": int(high.sum()), "logrank_chi2": stat, "logrank_p": p})
    return estimable.mark(out, estimable.survival_reasons(time, event, out["c_index"]))


__all__ = [
    "KaplanMeier",
    "TdAucPoint",
    "concordance_index",
    "default_horizons",
    "evaluate_survival",
    "kaplan_meier",
    "logrank_test",
    "time_dependent_auc",
]

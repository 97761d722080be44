"""Which figures of a held-out set cannot be estimated, and why: never a degenerate interval as a result.

A bootstrap interval on two test cases is [1.0, 1.0]; a C-index with two events rests on a handful of
pairs; an AUROC needs both classes. Each evaluator asks here which figures its cohort supports and
`mark` blanks the others (None in metrics.json) and records the reason under `not_estimable`
({figure key: reason}); the console line (`describe`) and report.html print the reason instead of
a number.

Rules (one place, so that train, predict --labels and the report agree):
- AUROC and average precision need two classes among the cases; their intervals need at least
  `MIN_PER_GROUP` cases of each class present.
- A C-index needs one comparable pair (an event before another case's time); its interval and the
  time-dependent AUCs' need at least `MIN_PER_GROUP` events.
- Correlations and R^2 need three cases with differing values; their intervals `MIN_CASES` cases.
- Any interval whose every resample gave one value (lo == hi) says nothing about uncertainty.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: cases of each class (classification) or events (survival) below which an interval is not estimated
MIN_PER_GROUP = 5
#: comparable pairs below which a validation C-index does not pick the best epoch: with k pairs it moves
#: in steps of 1/(2k), and the demo's two validation cases (one pair) gave 0.000 at every epoch
MIN_VAL_PAIRS = 10
#: cases below which a regression figure's interval is not estimated
MIN_CASES = 10
NOT_ESTIMABLE = "not_estimable"


def classification_reasons(
    labels: np.ndarray, classes: Sequence[str], ci_keys: Sequence[str]
) -> dict[str, str]:
    """Reasons per figure key for a categorical set (labels: (n,) class indices)."""
    labels = np.asarray(labels, dtype=np.int64)
    counts = {
        classes[k] if 0 <= k < len(classes) else str(k): int((labels == k).sum()) for k in np.unique(labels)
    }
    n = len(labels)
    if len(counts) < 2:
        only = f"only one class ({next(iter(counts))})" if counts else "no case"
        why = f"{only} among the {n} case(s): it compares classes"
        return {key: why for key in ("auroc", "auroc_ci95", "average_precision", "average_precision_ci95")}
    few = {name: c for name, c in counts.items() if c < MIN_PER_GROUP}
    if not few:
        return {}
    shown = ", ".join(f"{name} {c}" for name, c in counts.items())
    why = f"too few cases per class for a 95% interval ({shown}; at least {MIN_PER_GROUP} of each needed)"
    return {key: why for key in ci_keys}


def survival_reasons(time: np.ndarray, event: np.ndarray, c_index: float) -> dict[str, str]:
    """Reasons per figure key for a survival set."""
    n, events = len(time), int(np.asarray(event, dtype=bool).sum())
    reasons: dict[str, str] = {}
    if not math.isfinite(c_index):
        why = "no comparable pair (no event before another case's time)" if events else "no event"
        reasons["c_index"] = f"{why} among the {n} case(s): the C-index compares an event with later times"
    if events < MIN_PER_GROUP:
        why = f"only {events} event(s) among {n} case(s): a 95% interval needs at least {MIN_PER_GROUP}"
        reasons.update({"c_index_ci95": why, "td_auc": why})
    return reasons


def val_cindex_reason(n_cases: int, pairs: int) -> str:
    """Why a validation split's C-index is not used to choose epochs ("" when it is)."""
    if pairs >= MIN_VAL_PAIRS:
        return ""
    return (
        f"validation C-index not estimable: the validation split's {n_cases} case(s) hold {pairs} comparable "
        f"pair(s) (an event before another case's time; at least {MIN_VAL_PAIRS} needed), so it would only "
        "jump between 0, 0.5 and 1; the best epoch is chosen by the validation Cox loss"
    )


def regression_reasons(y: np.ndarray, figures: Mapping[str, Any], keys: Sequence[str]) -> dict[str, str]:
    """Reasons per figure key for one continuous target (y: its labelled values)."""
    n = len(y)
    reasons: dict[str, str] = {}
    for key in keys:
        value = figures.get(key)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            same = n >= 2 and bool(np.all(np.asarray(y) == np.asarray(y)[0]))
            reasons[key] = f"all {n} labelled values are equal" if same else f"only {n} labelled case(s)"
        if n < MIN_CASES:
            reasons[f"{key}_ci95"] = f"only {n} labelled case(s): a 95% interval needs at least {MIN_CASES}"
    return reasons


def mark(figures: dict[str, Any], reasons: Mapping[str, str]) -> dict[str, Any]:
    """Blank the figures `reasons` names, and every degenerate interval, recording why; returns `figures`.

    The key "td_auc" blanks the intervals of every time-dependent AUC point."""
    found = dict(figures.get(NOT_ESTIMABLE) or {})
    for key, why in reasons.items():
        if key == "td_auc":
            for point in figures.get("td_auc") or []:
                point["auc_ci95"] = [None, None]
            found["td_auc_ci95"] = why
        elif key in figures:
            figures[key] = [None, None] if key.endswith("_ci95") else None
            found[key] = why
    for key, value in list(figures.items()):
        if key.endswith("_ci95") and key not in found and _degenerate(value):
            figures[key] = [None, None]
            found[key] = (
                f"every bootstrap resample gave the same value ({value[0]:.3g}): the cases are too few or "
                "too uniform to show its uncertainty"
            )
    if found:
        figures[NOT_ESTIMABLE] = found
    return figures


def _degenerate(value: Any) -> bool:
    if not isinstance(value, list | tuple) or len(value) != 2:
        return False
    lo, hi = value
    return isinstance(lo, int | float) and isinstance(hi, int | float) and math.isfinite(lo) and lo == hi


def describe(figures: Mapping[str, Any], key: str, value_text: str, ci_text: str) -> str:
    """`value_text (95% CI ci_text)` for the console, or what is not estimable and why."""
    reasons = figures.get(NOT_ESTIMABLE) or {}
    if key in reasons:
        return f"not estimable ({reasons[key]})"
    if f"{key}_ci95" in reasons:
        return f"{value_text} (95% CI not estimable: {reasons[f'{key}_ci95']})"
    return f"{value_text} (95% CI {ci_text})"


__all__ = [
    "MIN_CASES", "MIN_PER_GROUP", "NOT_ESTIMABLE", "classification_reasons", "describe", "mark",
    "regression_reasons", "survival_reasons", "val_cindex_reason",
]  # fmt: skip

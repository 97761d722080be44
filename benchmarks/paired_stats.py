"""95% intervals of a paired difference from repeated K-fold cross-validation (R seeds x K folds).

Why two: the K folds of one seed share training bags and one partition, so their differences are not
independent, while the R seeds are independent repeats of the whole procedure. `paired_ci` is Student's
t over the R per-seed fold means (R - 1 df): the randomness of folds and initialisation on this cohort.
It does not cover drawing another cohort of the same size; `corrected_ci`, the corrected repeated-CV t
of Nadeau & Bengio (2003, Machine Learning 52:239) as used by Bouckaert & Frank (2004, PAKDD), inflates
the variance of all R x K differences by (1/(R K) + n_test/n_train) for the overlapping training sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class PairedCI:
    """Mean paired difference with a 95% interval; `n` is what the interval's t has n - 1 df over."""

    mean: float
    low: float
    high: float
    n: int

    def cell(self) -> str:
        if self.n < 2 or not math.isfinite(self.low):
            return f"{self.mean:+.3f} [n/a]"
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def paired_ci(diffs: np.ndarray, *, level: float = 0.95) -> PairedCI:
    """t interval over seeds of the fold-mean difference. `diffs`: (R seeds, K folds), NaN = no figure
    for that fold (e.g. a one-class test fold has no AUROC); a seed with no figure at all is dropped."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim != 2:
        raise ValueError(f"diffs must be (seeds, folds), got shape {d.shape}")
    per_seed = np.array([np.nanmean(row) for row in d if np.isfinite(row).any()])
    if per_seed.size == 0:
        raise ValueError("no finite paired difference: every fold of every seed lacks the figure")
    mean = float(per_seed.mean())
    if per_seed.size < 2:
        return PairedCI(mean, math.nan, math.nan, int(per_seed.size))
    half = float(
        stats.t.ppf(0.5 + level / 2, per_seed.size - 1) * per_seed.std(ddof=1) / math.sqrt(per_seed.size)
    )
    return PairedCI(mean, mean - half, mean + half, int(per_seed.size))


def corrected_ci(diffs: np.ndarray, *, test_over_train: float, level: float = 0.95) -> PairedCI:
    """Nadeau-Bengio corrected repeated-CV t interval over all finite (seed, fold) differences:
    variance (1/n + n_test/n_train) s^2 with n - 1 df, for training sets that overlap across folds."""
    d = np.asarray(diffs, dtype=np.float64).ravel()
    d = d[np.isfinite(d)]
    if d.size == 0:
        raise ValueError("no finite paired difference")
    mean = float(d.mean())
    if d.size < 2:
        return PairedCI(mean, math.nan, math.nan, int(d.size))
    se = math.sqrt((1.0 / d.size + test_over_train) * float(d.var(ddof=1)))
    half = float(stats.t.ppf(0.5 + level / 2, d.size - 1) * se)
    return PairedCI(mean, mean - half, mean + half, int(d.size))


def paired_difference(
    a: dict[tuple[int, int], float], b: dict[tuple[int, int], float], *, folds: int
) -> tuple[int, PairedCI, PairedCI] | None:
    """(seeds, `paired_ci`, `corrected_ci`) of a - b over the (seed, fold) figures both have; None when
    they share none. The corrected interval takes n_test / n_train as 1 / (K - 1): n_train counts the
    fold's validation bags too, the usual repeated-CV ratio."""
    paired = sorted(set(a) & set(b))
    if not paired:
        return None
    seeds = sorted({s for s, _ in paired})
    diffs = np.full((len(seeds), folds), math.nan)
    for s, k in paired:
        diffs[seeds.index(s), k - 1] = a[(s, k)] - b[(s, k)]
    return len(seeds), paired_ci(diffs), corrected_ci(diffs, test_over_train=1 / (folds - 1))


def num(v: object) -> str:
    """A table cell: a finite float to three places, else n/a."""
    return f"{v:.3f}" if isinstance(v, float) and math.isfinite(v) else "n/a"


def ci_cell(v: object, missing: str = "n/a") -> str:
    """A table cell: a PairedCI as `+m [low, high]`, else `missing`."""
    return v.cell() if isinstance(v, PairedCI) else missing


__all__ = ["PairedCI", "ci_cell", "corrected_ci", "num", "paired_ci", "paired_difference"]

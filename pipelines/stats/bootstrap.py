"""Percentile bootstrap intervals: resample the cases with replacement, recompute, take 2.5%-97.5%.

Several figures share one set of resamples (`bootstrap_cis`), so their intervals describe the same
resampled cohorts and the cost is one draw per resample. A resample on which a figure is undefined
(one class only, no event) is left out of that figure's interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

Statistic = Callable[[np.ndarray], float]  # resampled case indices (n,) -> a figure (NaN = undefined)


def resamples(n: int, *, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, n) case indices drawn with replacement, reproducible from `seed`."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, (n_resamples, n)) if n else np.zeros((n_resamples, 0), dtype=np.int64)


def percentile_interval(values: list[float] | np.ndarray) -> tuple[float, float]:
    """(2.5th, 97.5th) percentile of the finite values; NaN, NaN when there are none."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if not arr.size:
        return math.nan, math.nan
    lo, hi = np.percentile(arr, [2.5, 97.5])
    return float(lo), float(hi)


def bootstrap_cis(
    statistics: Mapping[str, Statistic], n: int, *, n_resamples: int, seed: int
) -> dict[str, tuple[float, float]]:
    """95% percentile interval of each statistic over the same `n_resamples` resamples of n cases."""
    draws = resamples(n, n_resamples=n_resamples, seed=seed)
    values: dict[str, list[float]] = {name: [] for name in statistics}
    for idx in draws:
        for name, fn in statistics.items():
            values[name].append(fn(idx))
    return {name: percentile_interval(v) for name, v in values.items()}


__all__ = ["Statistic", "bootstrap_cis", "percentile_interval", "resamples"]

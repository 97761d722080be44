"""Regression figures for one continuous target: Pearson r, Spearman rho, R^2 and MAE, each with a
95% bootstrap interval. Cases without a label (NaN) are left out first; figures need two cases with
varying values (otherwise NaN)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.stats import rankdata

from wsi.pipelines.stats import estimable
from wsi.pipelines.stats.bootstrap import bootstrap_cis

FIGURES = ("pearson_r", "spearman_rho", "r2", "mae")


def pearson_r(y: np.ndarray, p: np.ndarray) -> float:
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    if len(y) < 2:
        return math.nan
    dy, dp = y - y.mean(), p - p.mean()
    denom = math.sqrt(float((dy * dy).sum()) * float((dp * dp).sum()))
    return float((dy * dp).sum() / denom) if denom > 0 else math.nan


def spearman_rho(y: np.ndarray, p: np.ndarray) -> float:
    """Pearson r of the ranks (ties get their average rank), as scipy.stats.spearmanr."""
    return pearson_r(rankdata(y), rankdata(p)) if len(y) >= 2 else math.nan


def r2(y: np.ndarray, p: np.ndarray) -> float:
    """Coefficient of determination 1 - SS_res / SS_tot (can be negative), as sklearn's r2_score."""
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    ss_tot = float(((y - y.mean()) ** 2).sum()) if len(y) else 0.0
    return 1.0 - float(((y - p) ** 2).sum()) / ss_tot if len(y) >= 2 and ss_tot > 0 else math.nan


def mae(y: np.ndarray, p: np.ndarray) -> float:
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    return float(np.abs(y - p).mean()) if len(y) else math.nan


_FUNCTIONS = {"pearson_r": pearson_r, "spearman_rho": spearman_rho, "r2": r2, "mae": mae}


def evaluate_regression(
    y: np.ndarray, p: np.ndarray, *, n_bootstrap: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """{"n", <figure>, <figure>_ci95 ...} over the cases with a label."""
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    keep = np.isfinite(y)
    y, p = y[keep], p[keep]

    def on_resample(fn: Callable[[np.ndarray, np.ndarray], float]) -> Callable[[np.ndarray], float]:
        return lambda idx: fn(y[idx], p[idx])

    statistics = {name: on_resample(fn) for name, fn in _FUNCTIONS.items()}
    cis = bootstrap_cis(statistics, len(y), n_resamples=n_bootstrap, seed=seed)
    out: dict[str, Any] = {"n": len(y)}
    for name, fn in _FUNCTIONS.items():
        out[name] = fn(y, p)
        out[f"{name}_ci95"] = list(cis[name])
    return estimable.mark(out, estimable.regression_reasons(y, out, list(_FUNCTIONS)))


__all__ = ["FIGURES", "evaluate_regression", "mae", "pearson_r", "r2", "spearman_rho"]

"""The figures of a training run: the classification figures (`pipelines.stats.classification`,
re-exported here for training) and the cross-validation summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from wsi.pipelines.stats.classification import (
    auroc,
    binary_auroc,
    bootstrap_auroc,
    evaluate,
    json_safe,
    plot_roc,
)

#: figures every categorical cross-validation summary holds (mean, std and each fold's value)
CATEGORICAL_SUMMARY = ("auroc", "accuracy", "balanced_accuracy")


def summarize(
    per_fold: Sequence[dict[str, Any]], keys: Sequence[str] = CATEGORICAL_SUMMARY
) -> dict[str, Any]:
    """Mean and standard deviation (ddof=1) over folds of each scalar figure named in `keys`."""
    out: dict[str, Any] = {}
    for key in keys:
        vals = np.array([f[key] for f in per_fold if f.get(key) is not None], dtype=float)
        out[key] = {
            "mean": float(vals.mean()) if len(vals) else None,
            "std": float(vals.std(ddof=1)) if len(vals) > 1 else None,
            "folds": [f.get(key) for f in per_fold],
        }
    return out


__all__ = ["auroc", "binary_auroc", "bootstrap_auroc", "evaluate", "json_safe", "plot_roc", "summarize"]

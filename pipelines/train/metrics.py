"""Classification figures: AUROC with a 95% bootstrap interval, accuracy, balanced accuracy,
confusion matrix, and the ROC curve as a PNG.

Binary tasks report the AUROC of the second class (the positive one); more classes report the
macro one-vs-rest AUROC. An AUROC needs both classes present, so it is NaN when they are not
(and such bootstrap resamples are skipped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import (
    accuracy_score,
    balanced_accuracy_score,
    confusion_matrix,
    roc_curve,
)

from wsi.files import atomic_path


def binary_auroc(positive: np.ndarray, scores: np.ndarray) -> float:
    """Mann-Whitney AUROC (ties count one half); equals sklearn's roc_auc_score, ~30x faster, which
    matters for 1,000 bootstrap resamples."""
    positive = np.asarray(positive, dtype=bool)
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    ranks = rankdata(scores)  # average ranks for ties
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def auroc(labels: np.ndarray, probs: np.ndarray) -> float:
    """labels (n,) class indices, probs (n, C): the positive class's AUROC for C = 2, else the macro
    one-vs-rest AUROC over the classes present. NaN when fewer than two classes are present."""
    labels = np.asarray(labels)
    present = np.unique(labels)
    if len(present) < 2:
        return math.nan
    if probs.shape[1] == 2:
        return binary_auroc(labels == 1, probs[:, 1])
    return float(np.mean([binary_auroc(labels == c, probs[:, c]) for c in present]))


def bootstrap_auroc(
    labels: np.ndarray, probs: np.ndarray, *, n_resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """95% percentile interval of the AUROC over `n_resamples` resamples of the cases."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    values = []
    for _ in range(n_resamples):
        idx = rng.integers(0, n, n)
        if len(np.unique(labels[idx])) < 2:
            continue
        values.append(auroc(labels[idx], probs[idx]))
    if not values:
        return math.nan, math.nan
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def evaluate(
    labels: np.ndarray,
    probs: np.ndarray,
    classes: Sequence[str],
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """All figures for one set of predictions, JSON-ready (NaN becomes None)."""
    labels = np.asarray(labels, dtype=np.int64)
    preds = probs.argmax(axis=1)
    lo, hi = bootstrap_auroc(labels, probs, n_resamples=n_bootstrap, seed=seed)
    figures = {
        "n": len(labels),
        "auroc": auroc(labels, probs),
        "auroc_ci95": [lo, hi],
        "accuracy": float(accuracy_score(labels, preds)) if len(labels) else math.nan,
        "balanced_accuracy": _balanced_accuracy(labels, preds),
        "confusion_matrix": confusion_matrix(labels, preds, labels=list(range(len(classes)))).tolist(),
        "classes": list(classes),
    }
    return json_safe(figures)


def _balanced_accuracy(labels: np.ndarray, preds: np.ndarray) -> float:
    if len(labels) == 0:
        return math.nan
    import warnings

    with warnings.catch_warnings():  # "y_pred contains classes not in y_true" is expected on small sets
        warnings.simplefilter("ignore")
        return float(balanced_accuracy_score(labels, preds))


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def summarize(per_fold: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and standard deviation (ddof=1) over folds of each scalar figure."""
    out: dict[str, Any] = {}
    for key in ("auroc", "accuracy", "balanced_accuracy"):
        vals = np.array([f[key] for f in per_fold if f.get(key) is not None], dtype=float)
        out[key] = {
            "mean": float(vals.mean()) if len(vals) else None,
            "std": float(vals.std(ddof=1)) if len(vals) > 1 else None,
            "folds": [f.get(key) for f in per_fold],
        }
    return out


def plot_roc(
    labels: np.ndarray, probs: np.ndarray, classes: Sequence[str], out_png: Path, title: str
) -> None:
    """ROC curve(s): the positive class for binary tasks, one-vs-rest per class otherwise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=120)
    targets = [1] if len(classes) == 2 else range(len(classes))
    for c in targets:
        y = np.asarray(labels) == c
        if y.all() or not y.any():
            continue
        fpr, tpr, _ = roc_curve(y, probs[:, c])
        ax.plot(fpr, tpr, label=f"{classes[c]} (AUROC {binary_auroc(y, probs[:, c]):.3f})")
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=0.8)
    ax.set(xlabel="False positive rate", ylabel="True positive rate", title=title, xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)

"""Classification figures: AUROC with a 95% bootstrap interval, accuracy, balanced accuracy,
confusion matrix, average precision, and the curves of the report (ROC and precision-recall with
bootstrap bands, calibration), plus the ROC curve as a PNG.

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
    average_precision_score,
    balanced_accuracy_score,
    confusion_matrix,
    precision_recall_curve,
    roc_curve,
)

from wsi.core.files import atomic_path
from wsi.pipelines.stats.bootstrap import bootstrap_cis, percentile_interval, resamples

#: points of the common axis that bootstrap curves are read at (FPR for ROC, recall for PR)
CURVE_GRID = np.linspace(0.0, 1.0, 101)


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


#: axis limits of a curve on the unit square, with a margin so that a curve on its edges shows
UNIT_LIMITS = (-0.03, 1.03)


def plot_roc(
    labels: np.ndarray, probs: np.ndarray, classes: Sequence[str], out_png: Path, title: str
) -> bool:
    """ROC curve(s): the positive class for binary tasks, one-vs-rest per class otherwise. Returns False,
    drawing nothing, when no class has both positive and negative cases (a test split too small for an
    AUROC): an empty plot would only look like a result."""
    targets = [1] if len(classes) == 2 else range(len(classes))
    drawable = [c for c in targets if 0 < int((np.asarray(labels) == c).sum()) < len(labels)]
    if not drawable:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=120)
    for c in drawable:
        y = np.asarray(labels) == c
        fpr, tpr, _ = roc_curve(y, probs[:, c])
        ax.plot(fpr, tpr, lw=2, zorder=3, label=f"{classes[c]} (AUROC {binary_auroc(y, probs[:, c]):.3f})")
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=0.8)
    # a margin inside the frame: a perfect curve runs along x = 0 and y = 1, which the frame would hide
    ax.set(xlabel="False positive rate", ylabel="True positive rate", title=title, xlim=UNIT_LIMITS,
           ylim=UNIT_LIMITS)  # fmt: skip
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return True


def positive_targets(n_classes: int) -> list[int]:
    """The classes a curve is drawn for: the positive one of a binary task, else every class."""
    return [1] if n_classes == 2 else list(range(n_classes))


def average_precision(labels: np.ndarray, probs: np.ndarray) -> float:
    """Area under the precision-recall curve (scikit-learn's step-wise average precision): the
    positive class for C = 2, else the macro mean over the classes present; NaN with one class."""
    labels = np.asarray(labels)
    present = np.unique(labels)
    if len(present) < 2:
        return math.nan
    targets = [1] if probs.shape[1] == 2 else [int(c) for c in present]
    return float(np.mean([average_precision_score(labels == c, probs[:, c]) for c in targets]))


def extra_figures(
    labels: np.ndarray, probs: np.ndarray, *, n_bootstrap: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Average precision, and 95% intervals of it, of accuracy and of balanced accuracy (one shared
    set of resamples; the AUROC keeps its own interval from `bootstrap_auroc`)."""
    labels = np.asarray(labels, dtype=np.int64)
    preds = probs.argmax(axis=1) if len(labels) else np.zeros(0, dtype=np.int64)

    def two_classes(fn: Any) -> Any:
        return lambda idx: fn(idx) if len(np.unique(labels[idx])) > 1 else math.nan

    cis = bootstrap_cis(
        {
            "average_precision": two_classes(lambda idx: average_precision(labels[idx], probs[idx])),
            "accuracy": lambda idx: float((preds[idx] == labels[idx]).mean()) if len(idx) else math.nan,
            "balanced_accuracy": lambda idx: _balanced_accuracy(labels[idx], preds[idx]),
        },
        len(labels), n_resamples=n_bootstrap, seed=seed,
    )  # fmt: skip
    return json_safe(
        {
            "average_precision": average_precision(labels, probs) if len(labels) else math.nan,
            "average_precision_ci95": list(cis["average_precision"]),
            "accuracy_ci95": list(cis["accuracy"]),
            "balanced_accuracy_ci95": list(cis["balanced_accuracy"]),
        }
    )


def roc_band(
    positive: np.ndarray, scores: np.ndarray, *, n_resamples: int = 200, seed: int = 0
) -> dict[str, np.ndarray]:
    """The ROC curve read at `CURVE_GRID` false-positive rates, with a 95% bootstrap band:
    {"fpr", "tpr", "tpr_low", "tpr_high"} (NaN where one class is absent)."""
    positive = np.asarray(positive, dtype=bool)

    def curve(idx: np.ndarray) -> np.ndarray:
        y, s = positive[idx], scores[idx]
        if y.all() or not y.any():
            return np.full(len(CURVE_GRID), np.nan)
        fpr, tpr, _ = roc_curve(y, s)
        return np.interp(CURVE_GRID, fpr, tpr)

    return _band(curve, len(positive), "fpr", "tpr", n_resamples, seed)


def pr_band(
    positive: np.ndarray, scores: np.ndarray, *, n_resamples: int = 200, seed: int = 0
) -> dict[str, np.ndarray]:
    """Interpolated precision (the best precision at this recall or more) at `CURVE_GRID` recalls,
    with a 95% bootstrap band: {"recall", "precision", "precision_low", "precision_high"}."""
    positive = np.asarray(positive, dtype=bool)

    def curve(idx: np.ndarray) -> np.ndarray:
        y, s = positive[idx], scores[idx]
        if not y.any():
            return np.full(len(CURVE_GRID), np.nan)
        precision, recall, _ = precision_recall_curve(y, s)  # recall falls along the arrays
        best = np.maximum.accumulate(precision)  # best precision among the points so far (recall >= here)
        n_at_least = np.searchsorted(-recall, -CURVE_GRID, side="right")  # points with recall >= r
        return np.where(n_at_least > 0, best[np.maximum(n_at_least - 1, 0)], 0.0)

    return _band(curve, len(positive), "recall", "precision", n_resamples, seed)


def _band(curve: Any, n: int, x_name: str, y_name: str, n_resamples: int, seed: int) -> dict[str, np.ndarray]:
    whole = curve(np.arange(n))
    draws = np.stack([curve(idx) for idx in resamples(n, n_resamples=n_resamples, seed=seed)])
    bounds = np.array([percentile_interval(draws[:, j]) for j in range(len(CURVE_GRID))])
    low, high = bounds[:, 0], bounds[:, 1]
    return {x_name: CURVE_GRID.copy(), y_name: whole, f"{y_name}_low": low, f"{y_name}_high": high}


def calibration_bins(positive: np.ndarray, probs: np.ndarray, *, n_bins: int = 10) -> dict[str, np.ndarray]:
    """Reliability table: cases binned by predicted probability (equal-width bins over [0, 1]);
    {"bin", "mean_predicted", "observed", "n"} for the bins holding cases."""
    positive = np.asarray(positive, dtype=bool)
    probs = np.asarray(probs, dtype=np.float64)
    which = np.minimum((probs * n_bins).astype(int), n_bins - 1)
    rows = [
        (b, float(probs[which == b].mean()), float(positive[which == b].mean()), int((which == b).sum()))
        for b in range(n_bins)
        if (which == b).any()
    ]
    cols = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
    return {
        "bin": np.array(cols[0], dtype=np.int64),
        "mean_predicted": np.array(cols[1], dtype=np.float64),
        "observed": np.array(cols[2], dtype=np.float64),
        "n": np.array(cols[3], dtype=np.int64),
    }

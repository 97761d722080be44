"""Which weights a run keeps: the score that picks the best epoch, and weights averaged over epochs.

`val-figure` ranks epochs by the task kind's validation score (categorical: AUROC, ties by loss), the
paper's rule. On a small cohort that figure comes from a handful of validation bags and jumps from
epoch to epoch, so early stopping on it picks an epoch by chance; `smoothed-val-loss` ranks epochs by
the mean validation loss of the last `window` epochs instead (lower is better; the kind's own score
breaks ties). With `average_weights`, best.safetensors holds the mean of the weights of those same
epochs (weight averaging over the window the smoothed loss averaged: a flatter, steadier solution than
any one epoch), kept as one file per epoch in `window/` until training ends, so a resumed run averages
exactly what an uninterrupted one would.

Two rules of the baselines' authors' recipes (pipelines.train.recipe): `auroc-plus-accuracy` ranks by
DSMIL's score, (the sum of each output's validation AUROC + the share of bags whose every output is on
the right side of that output's Youden threshold) / 2 (binli123/dsmil-wsi train_tcga.py:134-181 @
80465ed534ac: multi_label_roc, optimal_thresh, get_current_score); `after_share` keeps the epochs up to
int(after_share * epochs) + 1 from becoming best.safetensors (DTFD-MIL's `ii > int(EPOCH * 0.8)`,
Main_DTFD_MIL.py:131 @ 10964f4dcc27), the last epoch always eligible.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from sklearn.metrics import roc_curve

from wsi.core.files import atomic_path
from wsi.pipelines.runs.checkpoints import load_weights, save_weights
from wsi.pipelines.runs.record import run_stamp
from wsi.pipelines.stats.classification import binary_auroc
from wsi.pipelines.study.tasks import TaskConfig

WINDOW_DIR = "window"


def smoothed_loss(losses: Sequence[float], window: int) -> float:
    """Mean of the last `window` validation losses (fewer at the start); NaN if any of them is NaN."""
    recent = [float(v) for v in losses[-window:]]
    return sum(recent) / len(recent) if recent else math.nan


@dataclass(frozen=True)
class Selection:
    """The task's `selection` settings, resolved (see pipelines.train.recipe)."""

    metric: str = "val-figure"
    window: int = 1
    average_weights: bool = False
    after_share: float = 0.0

    @classmethod
    def of(cls, task: TaskConfig) -> Selection:
        s = task.selection
        metric, window = s.metric or "val-figure", int(s.window or 1)
        return cls(metric, window, bool(s.average_weights), s.after_share or 0.0)

    def eligible(self, epoch: int, epochs: int) -> bool:
        """Whether 1-based `epoch` of `epochs` may become best.safetensors (`after_share`)."""
        return epoch >= epochs or epoch - 1 > int(self.after_share * epochs) or not self.after_share

    def figure(
        self, kind_score: tuple[float, float], labels: np.ndarray, outputs: np.ndarray, n_outputs: int
    ) -> tuple[float, float]:
        """The validation figure this selection ranks by: the kind's score, or DSMIL's (ties: the
        kind's second key, the validation loss)."""
        if self.metric != "auroc-plus-accuracy":
            return kind_score
        value = auroc_plus_accuracy(labels, outputs, n_outputs)
        return (-math.inf if math.isnan(value) else value, kind_score[1])

    def score(
        self, log: Sequence[dict[str, Any]], row: dict[str, Any], figure: tuple[float, float]
    ) -> tuple[float, float]:
        """The epoch's rank (larger wins) from the earlier log rows, its own row and the kind's score."""
        if self.metric in ("val-figure", "auroc-plus-accuracy"):
            return figure
        mean = smoothed_loss([r["val_loss"] for r in (*log, row)], self.window)
        return (-mean if not math.isnan(mean) else -math.inf, figure[0])

    def remember(self, model: torch.nn.Module, run_dir: Path, epoch: int) -> None:
        """Keep this epoch's weights while they can still enter an average; drop older ones."""
        if not self.average_weights or self.window < 2:
            return
        folder = run_dir / WINDOW_DIR
        folder.mkdir(exist_ok=True)
        save_weights(model, folder / f"epoch-{epoch:05d}.safetensors", {"epoch": str(epoch)})
        for path in folder.glob("epoch-*.safetensors"):
            if not epoch - self.window < _epoch_of(path) <= epoch:
                path.unlink(missing_ok=True)  # too old, or left by an interrupted later epoch

    def save_best(self, model: torch.nn.Module, path: Path, epoch: int) -> None:
        """Write best.safetensors: the model as it is, or the mean over the window ending at `epoch`."""
        stamp = {"epoch": str(epoch), **run_stamp(path.parent)}  # which run's config.json they belong to
        if not self.average_weights or self.window < 2:
            save_weights(model, path, stamp)
            return
        files = [
            p
            for p in sorted((path.parent / WINDOW_DIR).glob("epoch-*.safetensors"))
            if epoch - self.window < _epoch_of(p) <= epoch
        ]
        states = [load_weights(p) for p in files]
        mean = {  # a tensor no epoch changed (the input standardisation) is kept bit for bit
            key: torch.stack([s[key].float() for s in states]).mean(0).to(value.dtype)
            if value.is_floating_point() and not all(torch.equal(s[key], value) for s in states)
            else value
            for key, value in states[-1].items()
        }
        epochs = ",".join(str(_epoch_of(p)) for p in files)
        with atomic_path(path) as tmp:
            save_file(mean, str(tmp), metadata={**stamp, "averaged_epochs": epochs})

    def finish(self, run_dir: Path) -> None:
        """Training is over: the per-epoch weights are no longer needed."""
        shutil.rmtree(run_dir / WINDOW_DIR, ignore_errors=True)


def auroc_plus_accuracy(labels: np.ndarray, probs: np.ndarray, n_outputs: int) -> float:
    """DSMIL's validation score of class indices (n,) and class probabilities (n, C) from `n_outputs`
    sigmoid outputs: one output for two classes (probs[:, 1], target = the class), else one per class
    (one-hot targets). A class absent from the set counts AUROC 1 and predicts no bag (the authors')."""
    if len(labels) == 0:
        return math.nan
    scores = probs[:, 1:2] if n_outputs == 1 else probs
    truth = labels[:, None] == 1 if n_outputs == 1 else np.eye(probs.shape[1], dtype=bool)[labels]
    aucs, predicted = [], []
    for c in range(scores.shape[1]):
        y, s = truth[:, c], scores[:, c]
        if y.all() or not y.any():
            aucs.append(1.0)
            predicted.append(np.zeros(len(s), dtype=bool))
            continue
        aucs.append(binary_auroc(y, s))
        fpr, tpr, thresholds = roc_curve(y, s, pos_label=True)
        predicted.append(s >= thresholds[np.argmin(fpr - tpr)])
    exact = float(np.mean(np.all(np.stack(predicted, axis=1) == truth, axis=1)))
    return (sum(aucs) + exact) / 2


def _epoch_of(path: Path) -> int:
    return int(path.stem.split("-")[1])


__all__ = ["WINDOW_DIR", "Selection", "auroc_plus_accuracy", "smoothed_loss"]

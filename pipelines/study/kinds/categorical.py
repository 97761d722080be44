"""`kind: categorical`: one class per case, cross-entropy, softmax probabilities, AUROC and friends.

This is what `wsi train` always did, and it does it the same way: the same loss on the same labels,
validation AUROC (ties broken by validation loss) picks the best epoch, and the same test figures.

The task's resolved `model.scoring` says how outputs become probabilities. `softmax` (every model but
DSMIL): one output per class, cross-entropy, a softmax across them. `sigmoid` (DSMIL's authors,
binli123/dsmil-wsi train_tcga.py @ 80465ed534ac: get_bag_feats, test): each output its own sigmoid,
trained by BCE; two classes have ONE output z, the first class the negative one (all-zero target), so
p = (1 - sigmoid(z), sigmoid(z)); more classes one output each, p_c = sigmoid(z_c), not normalised
(accuracy is the argmax, the AUROC each class's own ranking). Per-tile contributions of the one output
are the second class's log-odds share (the first class's is its negative).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from wsi.core.errors import LabelError
from wsi.models.base.objectives import sigmoid_targets, weighted_mean
from wsi.pipelines.inputs import Item
from wsi.pipelines.inputs.heatmaps import class_scale, contribution_to_class, probability_text
from wsi.pipelines.stats import classification as cls_stats
from wsi.pipelines.stats import estimable
from wsi.pipelines.study.kinds import KINDS, PredictionSet, TargetView, TaskKind, fmt3, worst_if_nan


def cross_entropy_of_probs(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean -log p(true class): the validation loss, from probabilities (NaN for no case)."""
    if len(labels) == 0:
        return math.nan
    p = np.clip(probs[np.arange(len(labels)), labels], 1e-12, 1.0)
    return float(-np.log(p).mean())


def bce_of_probs(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean over cases and classes of the binary cross-entropy of each class's probability against the
    one-hot class (sigmoid scoring's validation loss; for two classes it is the one output's BCE)."""
    if len(labels) == 0:
        return math.nan
    p = np.clip(probs.astype(np.float64), 1e-12, 1 - 1e-12)  # float32 rounds 1 - 1e-12 up to 1
    onehot = np.eye(probs.shape[1])[labels]
    return float(-(onehot * np.log(p) + (1 - onehot) * np.log(1 - p)).mean())


@KINDS.register("categorical")
class CategoricalKind(TaskKind):
    name: ClassVar[str] = "categorical"
    headline: ClassVar[str] = "auroc"
    val_columns: ClassVar[tuple[str, ...]] = ("val_auroc", "val_accuracy")
    summary_keys: ClassVar[tuple[str, ...]] = ("auroc", "accuracy", "balanced_accuracy")

    def __init__(self, task: Any, fitted: Mapping[str, Any] | None = None) -> None:
        super().__init__(task, fitted)
        self.classes: tuple[str, ...] = tuple(task.classes)
        self.class_weights: torch.Tensor | None = None
        self.sigmoid = task.model.scoring == "sigmoid"  # None (a run before scoring existed): softmax

    @property
    def target_names(self) -> tuple[str, ...]:
        return ("label",)

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.classes

    @property
    def num_outputs(self) -> int:
        """One per class; one for two classes scored by a sigmoid (the authors' DSMIL convention)."""
        return 1 if self.sigmoid and len(self.classes) == 2 else len(self.classes)

    @property
    def output_columns(self) -> tuple[str, ...]:
        return tuple(f"prob_{c}" for c in self.classes)

    def label_columns(self) -> tuple[str, ...]:
        return (self.task.columns.label,)

    def parse_cells(self, cells: Sequence[str | None]) -> tuple[float, ...]:
        label = (cells[0] or "").strip()
        if label not in self.classes:
            raise ValueError(f"{label!r}")
        return (float(self.classes.index(label)),)

    def format_target(self, target: Sequence[float]) -> list[str]:
        return ["" if math.isnan(target[0]) else self.classes[int(target[0])]]

    def stratum(self, target: Sequence[float]) -> int:
        return int(target[0])

    def check_cohort(self, items: Sequence[Item], where: str) -> None:
        patients: dict[int, set[str]] = {i: set() for i in range(len(self.classes))}
        for it in items:
            patients[it.label].add(it.group)
        few = [f"{c} ({len(patients[i])})" for i, c in enumerate(self.classes) if len(patients[i]) < 2]
        if few:
            raise LabelError(
                f"{where}: class(es) with fewer than two patients that have an input file: "
                f"{', '.join(few)}; a patient-grouped split needs at least two per class"
            )

    def fit(self, train: Sequence[Item], device: torch.device) -> None:
        """Balanced class weights (inverse to each class's share of the training cases), when asked."""
        if self.task.class_weighting == "none":
            return
        counts = np.bincount([it.label for it in train], minlength=len(self.classes)).astype(np.float64)
        weights = len(train) / (len(self.classes) * np.maximum(counts, 1))
        self.class_weights = torch.tensor(weights, dtype=torch.float32, device=device)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if not self.sigmoid:
            return F.cross_entropy(logits.float(), labels, weight=self.class_weights)
        target = sigmoid_targets(labels, logits.shape[-1])
        per_bag = F.binary_cross_entropy_with_logits(logits.float(), target, reduction="none").mean(1)
        return weighted_mean(per_bag, labels, self.class_weights)

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.sigmoid:
            return torch.softmax(logits.float(), dim=-1)
        p = torch.sigmoid(logits.float())
        return torch.cat([1 - p, p], dim=-1) if p.shape[-1] == 1 else p

    def class_scores(self, values: np.ndarray) -> np.ndarray:
        """(..., outputs) logits or per-tile contributions in class space (..., classes): one output
        for two classes is the second class's log-odds, (0, z)."""
        if values.shape[-1] == len(self.classes):
            return values
        return np.concatenate([np.zeros_like(values), values], axis=-1)

    def validation(
        self, targets: np.ndarray, outputs: np.ndarray, logits: np.ndarray
    ) -> tuple[float, dict[str, float], tuple[float, float]]:
        labels = targets[:, 0].astype(np.int64) if len(targets) else np.zeros(0, dtype=np.int64)
        val_auroc = cls_stats.auroc(labels, outputs) if len(labels) else math.nan
        val_loss = (bce_of_probs if self.sigmoid else cross_entropy_of_probs)(labels, outputs)
        val_acc = float((outputs.argmax(1) == labels).mean()) if len(labels) else math.nan
        score = (worst_if_nan(val_auroc), -val_loss if not math.isnan(val_loss) else -math.inf)
        return val_loss, {"val_auroc": val_auroc, "val_accuracy": val_acc}, score

    def evaluate(self, preds: PredictionSet, *, n_bootstrap: int, seed: int) -> dict[str, Any]:
        labels = preds.targets[:, 0].astype(np.int64)
        probs = preds.outputs
        figures = cls_stats.evaluate(labels, probs, self.classes, n_bootstrap=n_bootstrap, seed=seed)
        figures.update(cls_stats.extra_figures(labels, probs, n_bootstrap=n_bootstrap, seed=seed))
        ci_keys = [k for k in figures if k.endswith("_ci95")]
        return estimable.mark(figures, estimable.classification_reasons(labels, self.classes, ci_keys))

    def summary_line(self, metrics: Mapping[str, Any]) -> str:
        acc, bal = metrics.get("accuracy"), metrics.get("balanced_accuracy")
        line = super().summary_line(metrics).replace("auroc", "AUROC")
        return f"{line}, accuracy {fmt3(acc)}, balanced accuracy {fmt3(bal)}"

    def target_views(self, preds: PredictionSet) -> list[TargetView]:
        labels = preds.targets[:, 0].astype(np.int64)
        return [TargetView("", "categorical", self.classes, labels, preds.outputs, list(preds.ids))]

    def contribution_maps(self, contributions: np.ndarray) -> dict[str, np.ndarray]:
        contributions = self.class_scores(contributions)
        return {c: contribution_to_class(contributions, i) for i, c in enumerate(self.classes)}

    def heatmap_maps(
        self, contributions: np.ndarray, output: np.ndarray
    ) -> list[tuple[str, np.ndarray, str]]:
        pred = int(output.argmax())
        title = f"{self.classes[pred]} ({probability_text(float(output[pred]))})"
        return [("", contribution_to_class(self.class_scores(contributions), pred), title)]

    def heatmap_scale(self, suffix: str, output: np.ndarray) -> str:
        return class_scale(self.classes[int(output.argmax())], self.classes)

    def derived_columns(self) -> tuple[str, ...]:
        return ("predicted",)

    def derived_cells(self, output: np.ndarray) -> list[str]:
        """The predicted class; blank for probabilities that are not finite (argmax of NaN would pick one)."""
        return [self.classes[int(output.argmax())] if np.isfinite(output).all() else ""]


__all__ = ["CategoricalKind", "bce_of_probs", "cross_entropy_of_probs"]

"""`kind: multi-target`: several categorical and/or continuous targets from one model (a mutation panel).

Each target owns a slice of the model's outputs (its classes' logits, or one value), in the order the
task lists them. The loss is the sum over targets of weight x that target's loss (cross-entropy, or
the regression loss on standardised values) over the cases labelled for it: a missing label (blank
cell) masks that target for that case only. Validation loss picks the best epoch (ties by the mean
per-target figure); the test split reports every target's own figures (AUROC and friends, or Pearson
r and friends) and `score`, their mean (AUROC for categorical targets, Pearson r for continuous ones).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from wsi.core.errors import LabelError
from wsi.pipelines.inputs import Item
from wsi.pipelines.inputs.heatmaps import contribution_to_class, probability_text
from wsi.pipelines.stats import classification as cls_stats
from wsi.pipelines.stats import estimable
from wsi.pipelines.stats import regression as reg_stats
from wsi.pipelines.study.kinds import (
    KINDS,
    PredictionSet,
    TargetView,
    TaskKind,
    figure_text,
    fmt3,
    loss_over_set,
    nanmean,
    parse_number,
    worst_if_nan,
)
from wsi.pipelines.study.kinds.losses import masked_regression_loss
from wsi.pipelines.study.kinds.regression import ContinuousTargets, check_continuous, tertile
from wsi.pipelines.study.tasks import TargetConfig


@KINDS.register("multi-target")
class MultiTargetKind(TaskKind):
    name: ClassVar[str] = "multi-target"
    headline: ClassVar[str] = "score"
    val_columns: ClassVar[tuple[str, ...]] = ("val_score",)
    summary_keys: ClassVar[tuple[str, ...]] = ("score",)

    def __init__(self, task: Any, fitted: Mapping[str, Any] | None = None) -> None:
        super().__init__(task, fitted)
        self.targets: tuple[TargetConfig, ...] = tuple(task.targets)
        self.slices: list[slice] = []
        start = 0
        for t in self.targets:
            width = len(t.classes) if t.type == "categorical" else 1
            self.slices.append(slice(start, start + width))
            start += width
        self.continuous = [i for i, t in enumerate(self.targets) if t.type == "continuous"]
        self.categorical = [i for i, t in enumerate(self.targets) if t.type == "categorical"]
        opts = task.regression_options
        self.scaling = ContinuousTargets(
            [self.targets[i].column for i in self.continuous], opts.standardize, self.fitted_values
        )
        self.cuts: tuple[float, ...] = ()

    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(t.column for t in self.targets)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(
            name
            for t in self.targets
            for name in ([f"{t.column}={c}" for c in t.classes] if t.type == "categorical" else [t.column])
        )

    @property
    def output_columns(self) -> tuple[str, ...]:
        return tuple(
            name
            for t in self.targets
            for name in (
                [f"prob_{t.column}={c}" for c in t.classes]
                if t.type == "categorical"
                else [f"pred_{t.column}"]
            )
        )

    def parse_cells(self, cells: Sequence[str | None]) -> tuple[float, ...]:
        out = []
        for t, cell in zip(self.targets, cells, strict=True):
            if t.type == "continuous":
                out.append(parse_number(cell, t.column))
                continue
            text = (cell or "").strip()
            if text.lower() in ("", "na", "nan", "n/a", "none", "null", "."):
                out.append(math.nan)
            elif text in t.classes:
                out.append(float(t.classes.index(text)))
            else:
                raise ValueError(f"{t.column} {text!r} is not one of {list(t.classes)}")
        return tuple(out)

    def format_target(self, target: Sequence[float]) -> list[str]:
        cells = []
        for t, v in zip(self.targets, target, strict=True):
            if math.isnan(v):
                cells.append("")
            else:
                cells.append(t.classes[int(v)] if t.type == "categorical" else f"{v:g}")
        return cells

    def set_strata(self, items: Sequence[Item]) -> None:
        if not self.categorical and self.continuous:
            first = np.array([it.target[self.continuous[0]] for it in items], dtype=np.float64)
            first = first[np.isfinite(first)]
            self.cuts = tuple(np.percentile(first, [100 / 3, 200 / 3])) if len(first) else ()

    def stratum(self, target: Sequence[float]) -> int:
        """The first categorical target's class (-1 when missing), else a tertile of the first value."""
        if self.categorical:
            value = target[self.categorical[0]]
            return -1 if math.isnan(value) else int(value)
        return tertile(target[self.continuous[0]], self.cuts)

    def check_cohort(self, items: Sequence[Item], where: str) -> None:
        super().check_cohort(items, where)
        for i in self.categorical:
            t = self.targets[i]
            patients: dict[int, set[str]] = {c: set() for c in range(len(t.classes))}
            for it in items:
                if not math.isnan(it.target[i]):
                    patients[int(it.target[i])].add(it.group)
            few = [f"{c} ({len(patients[k])})" for k, c in enumerate(t.classes) if len(patients[k]) < 2]
            if few:
                raise LabelError(
                    f"{where}: target {t.column!r} has class(es) with fewer than two labelled patients: "
                    f"{', '.join(few)}"
                )
        check_continuous(items, [self.targets[i].column for i in self.continuous], self.continuous, where)

    def fit(self, train: Sequence[Item], device: torch.device) -> None:
        values = np.array([[it.target[i] for i in self.continuous] for it in train], dtype=np.float64)
        self.fitted_values = {"target_scaling": self.scaling.fit(values.reshape(len(train), -1))}

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits, targets = logits.float(), targets.float()
        total = logits.sum() * 0.0  # keeps the graph when no target is labelled in this batch
        for i in self.categorical:
            known = torch.isfinite(targets[:, i])
            if bool(known.any()):
                ce = F.cross_entropy(logits[known, self.slices[i]], targets[known, i].long())
                total = total + self.targets[i].weight * ce
        if self.continuous:
            cols = [self.slices[i].start for i in self.continuous]
            weights = torch.tensor([self.targets[i].weight for i in self.continuous], device=logits.device)
            opts = self.task.regression_options
            total = total + masked_regression_loss(
                logits[:, cols], self.scaling.to_model(targets[:, self.continuous]), weights,
                loss=opts.loss, huber_delta=opts.huber_delta,
            )  # fmt: skip
        return total

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        parts = []
        values = self.scaling.from_model(logits[:, [self.slices[i].start for i in self.continuous]])
        k = 0
        for i, t in enumerate(self.targets):
            if t.type == "categorical":
                parts.append(torch.softmax(logits[:, self.slices[i]], dim=-1))
            else:
                parts.append(values[:, k : k + 1])
                k += 1
        return torch.cat(parts, dim=1)

    def per_target(self, targets: np.ndarray, outputs: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(labels, outputs) of target i over the cases labelled for it."""
        keep = np.isfinite(targets[:, i])
        return targets[keep, i], outputs[keep][:, self.slices[i]]

    def validation(
        self, targets: np.ndarray, outputs: np.ndarray, logits: np.ndarray
    ) -> tuple[float, dict[str, float], tuple[float, float]]:
        val_loss = loss_over_set(self, targets, logits)
        figures = []
        for i, t in enumerate(self.targets):
            y, out = self.per_target(targets, outputs, i)
            if t.type == "categorical":
                figures.append(cls_stats.auroc(y.astype(np.int64), out) if len(y) else math.nan)
            else:
                figures.append(reg_stats.pearson_r(y, out[:, 0]))
        score = nanmean(figures)
        return (
            val_loss,
            {"val_score": score},
            (-val_loss if not math.isnan(val_loss) else -math.inf, worst_if_nan(score)),
        )

    def evaluate(self, preds: PredictionSet, *, n_bootstrap: int, seed: int) -> dict[str, Any]:
        per_target: dict[str, Any] = {}
        heads = []
        for i, t in enumerate(self.targets):
            y, out = self.per_target(preds.targets, preds.outputs, i)
            if t.type == "categorical":
                labels = y.astype(np.int64)
                figures = cls_stats.evaluate(labels, out, t.classes, n_bootstrap=n_bootstrap, seed=seed + i)
                figures.update(cls_stats.extra_figures(labels, out, n_bootstrap=n_bootstrap, seed=seed + i))
                ci_keys = [k for k in figures if k.endswith("_ci95")]
                estimable.mark(figures, estimable.classification_reasons(labels, t.classes, ci_keys))
                heads.append(figures["auroc"])
            else:
                figures = reg_stats.evaluate_regression(y, out[:, 0], n_bootstrap=n_bootstrap, seed=seed + i)
                heads.append(figures["pearson_r"])
            per_target[t.column] = {"type": t.type, **figures}
        return {"n": len(preds), "targets": per_target, "score": nanmean(heads)}

    def summary_line(self, metrics: Mapping[str, Any]) -> str:
        parts = [f"mean score {fmt3(metrics.get('score'))}"]
        for column, f in (metrics.get("targets") or {}).items():
            figure = "auroc" if f.get("type") == "categorical" else "pearson_r"
            name = "AUROC" if figure == "auroc" else "Pearson r"
            parts.append(f"{column}: {name} {figure_text(f, figure)} on n={f.get('n')}")
        return "; ".join(parts)

    def target_views(self, preds: PredictionSet) -> list[TargetView]:
        views = []
        for i, t in enumerate(self.targets):
            keep = np.isfinite(preds.targets[:, i])
            y = preds.targets[keep, i]
            ids = [c for c, ok in zip(preds.ids, keep, strict=True) if ok]
            out = preds.outputs[keep][:, self.slices[i]]
            views.append(
                TargetView(t.column, t.type, t.classes, y.astype(np.int64) if t.classes else y, out, ids)
            )
        return views

    def contribution_maps(self, contributions: np.ndarray) -> dict[str, np.ndarray]:
        maps: dict[str, np.ndarray] = {}
        k = 0
        for i, t in enumerate(self.targets):
            part = contributions[:, self.slices[i]]
            if t.type == "categorical":
                maps.update(
                    {f"{t.column}={c}": contribution_to_class(part, j) for j, c in enumerate(t.classes)}
                )
            else:
                maps[t.column] = part[:, 0] * self.scaling.std[k]
                k += 1
        return maps

    def heatmap_maps(
        self, contributions: np.ndarray, output: np.ndarray
    ) -> list[tuple[str, np.ndarray, str]]:
        maps = self.contribution_maps(contributions)
        drawn = []
        for i, t in enumerate(self.targets):
            out = output[self.slices[i]]
            if t.type == "categorical":
                pred = int(out.argmax())
                key, title = (
                    f"{t.column}={t.classes[pred]}",
                    f"{t.column}: {t.classes[pred]} ({probability_text(float(out[pred]))})",
                )
            else:
                key, title = t.column, f"{t.column} = {out[0]:.3g}"
            drawn.append((f".{t.column}", maps[key], title))
        return drawn

    def heatmap_scale(self, suffix: str, output: np.ndarray) -> str:
        from wsi.pipelines.inputs.heatmaps import class_scale, value_scale

        for i, t in enumerate(self.targets):
            if f".{t.column}" == suffix and t.type == "categorical":
                return class_scale(t.classes[int(output[self.slices[i]].argmax())], t.classes)
        return value_scale(suffix.removeprefix("."))

    def derived_columns(self) -> tuple[str, ...]:
        return tuple(f"predicted_{self.targets[i].column}" for i in self.categorical)

    def derived_cells(self, output: np.ndarray) -> list[str]:
        """Each categorical target's class; blank where its probabilities are not finite."""
        cells = []
        for i in self.categorical:
            probs = output[self.slices[i]]
            cells.append(self.targets[i].classes[int(probs.argmax())] if np.isfinite(probs).all() else "")
        return cells


__all__ = ["MultiTargetKind"]

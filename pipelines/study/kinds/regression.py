"""`kind: regression`: one or more continuous targets (a score, tumour purity), one output each.

The model learns z-scores of the training split's values when `regression.standardize` is on (the
mean and standard deviation are saved with the run so predictions come out in the label's units),
with MSE or Huber loss; a case may miss some targets (masked). Validation loss picks the best epoch
(ties by the mean Pearson r); the test split reports Pearson r, Spearman rho, R^2 and MAE per target
with 95% bootstrap intervals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from wsi.core.errors import LabelError
from wsi.pipelines.inputs import Item
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


class ContinuousTargets:
    """Standardisation of continuous targets: fitted on training values, inverted on outputs."""

    def __init__(self, columns: Sequence[str], standardize: bool, fitted: Mapping[str, Any]) -> None:
        self.columns = tuple(columns)
        self.standardize = standardize
        scaling = fitted.get("target_scaling", {})
        self.mean = np.array([scaling.get(c, (0.0, 1.0))[0] for c in self.columns], dtype=np.float64)
        self.std = np.array([scaling.get(c, (0.0, 1.0))[1] for c in self.columns], dtype=np.float64)

    def fit(self, values: np.ndarray) -> dict[str, list[float]]:
        """values (n, T) with NaN = missing -> {column: [mean, std]} (std 1 where it would be 0)."""
        if not self.standardize:
            return {}
        for t in range(len(self.columns)):
            col = values[:, t][np.isfinite(values[:, t])]
            self.mean[t] = float(col.mean()) if len(col) else 0.0
            std = float(col.std()) if len(col) > 1 else 0.0
            self.std[t] = std if std > 0 else 1.0
        return {c: [float(m), float(s)] for c, m, s in zip(self.columns, self.mean, self.std, strict=True)}

    def to_model(self, values: torch.Tensor) -> torch.Tensor:
        mean, std = self._tensors(values)
        return (values - mean) / std

    def from_model(self, logits: torch.Tensor) -> torch.Tensor:
        mean, std = self._tensors(logits)
        return logits * std + mean

    def _tensors(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = torch.as_tensor(self.mean, dtype=torch.float32, device=like.device)
        std = torch.as_tensor(self.std, dtype=torch.float32, device=like.device)
        return mean, std


def check_continuous(items: Sequence[Item], columns: Sequence[str], index: Sequence[int], where: str) -> None:
    """Each continuous target needs values for at least three patients, and not all the same."""
    for column, t in zip(columns, index, strict=True):
        values = {it.group: it.target[t] for it in items if math.isfinite(it.target[t])}
        if len(values) < 3 or len(set(values.values())) < 2:
            raise LabelError(
                f"{where}: target {column!r} has {len(values)} patient(s) with a value "
                f"({len(set(values.values()))} distinct); a regression needs at least 3 that vary"
            )


def tertile(value: float, cuts: Sequence[float]) -> int:
    return -1 if math.isnan(value) else int(np.searchsorted(cuts, value, side="right"))


@KINDS.register("regression")
class RegressionKind(TaskKind):
    name: ClassVar[str] = "regression"
    headline: ClassVar[str] = "pearson_r"
    val_columns: ClassVar[tuple[str, ...]] = ("val_pearson_r", "val_mae")
    summary_keys: ClassVar[tuple[str, ...]] = reg_stats.FIGURES

    def __init__(self, task: Any, fitted: Mapping[str, Any] | None = None) -> None:
        super().__init__(task, fitted)
        self.columns = tuple(t.column for t in task.targets)
        opts = task.regression_options
        self.scaling = ContinuousTargets(self.columns, opts.standardize, self.fitted_values)
        self.weights = torch.tensor([t.weight for t in task.targets], dtype=torch.float32)
        self.cuts: tuple[float, ...] = ()  # tertiles of the first target: the split strata

    @property
    def target_names(self) -> tuple[str, ...]:
        return self.columns

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.columns

    @property
    def output_columns(self) -> tuple[str, ...]:
        return tuple(f"pred_{c}" for c in self.columns)

    def parse_cells(self, cells: Sequence[str | None]) -> tuple[float, ...]:
        return tuple(parse_number(cell, col) for cell, col in zip(cells, self.columns, strict=True))

    def set_strata(self, items: Sequence[Item]) -> None:
        first = np.array([it.target[0] for it in items], dtype=np.float64)
        first = first[np.isfinite(first)]
        self.cuts = tuple(np.percentile(first, [100 / 3, 200 / 3])) if len(first) else ()

    def stratum(self, target: Sequence[float]) -> int:
        return tertile(target[0], self.cuts)

    def check_cohort(self, items: Sequence[Item], where: str) -> None:
        super().check_cohort(items, where)
        check_continuous(items, self.columns, range(len(self.columns)), where)

    def fit(self, train: Sequence[Item], device: torch.device) -> None:
        values = np.array([it.target for it in train], dtype=np.float64).reshape(len(train), -1)
        self.fitted_values = {"target_scaling": self.scaling.fit(values)}

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        opts = self.task.regression_options
        return masked_regression_loss(
            logits.float(), self.scaling.to_model(targets.float()), self.weights.to(logits.device),
            loss=opts.loss, huber_delta=opts.huber_delta,
        )  # fmt: skip

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        return self.scaling.from_model(logits.float())

    def validation(
        self, targets: np.ndarray, outputs: np.ndarray, logits: np.ndarray
    ) -> tuple[float, dict[str, float], tuple[float, float]]:
        val_loss = loss_over_set(self, targets, logits)
        rs, maes = [], []
        for t in range(len(self.columns)):
            keep = np.isfinite(targets[:, t])
            rs.append(reg_stats.pearson_r(targets[keep, t], outputs[keep, t]))
            maes.append(reg_stats.mae(targets[keep, t], outputs[keep, t]))
        r, mae = nanmean(rs), nanmean(maes)
        return val_loss, {"val_pearson_r": r, "val_mae": mae}, (-_nan_inf(val_loss), worst_if_nan(r))

    def evaluate(self, preds: PredictionSet, *, n_bootstrap: int, seed: int) -> dict[str, Any]:
        per_target = {
            c: reg_stats.evaluate_regression(
                preds.targets[:, t], preds.outputs[:, t], n_bootstrap=n_bootstrap, seed=seed + t
            )
            for t, c in enumerate(self.columns)
        }
        out: dict[str, Any] = {"n": len(preds), "targets": per_target}
        for figure in reg_stats.FIGURES:  # the mean over targets: what a cross-validation summarises
            out[figure] = nanmean([f[figure] for f in per_target.values()])
            if len(self.columns) == 1:
                out[f"{figure}_ci95"] = per_target[self.columns[0]][f"{figure}_ci95"]
        if len(self.columns) == 1 and estimable.NOT_ESTIMABLE in per_target[self.columns[0]]:
            out[estimable.NOT_ESTIMABLE] = per_target[self.columns[0]][estimable.NOT_ESTIMABLE]
        return out

    def summary_line(self, metrics: Mapping[str, Any]) -> str:
        parts = []
        for c, f in (metrics.get("targets") or {}).items():
            parts.append(f"{c}: Pearson r {figure_text(f, 'pearson_r')}, "
                         f"R^2 {fmt3(f.get('r2'))}, MAE {fmt3(f.get('mae'))}")  # fmt: skip
        return "; ".join(parts)

    def target_views(self, preds: PredictionSet) -> list[TargetView]:
        views = []
        for t, c in enumerate(self.columns):
            keep = np.isfinite(preds.targets[:, t])
            ids = [i for i, ok in zip(preds.ids, keep, strict=True) if ok]
            views.append(
                TargetView(c, "continuous", (), preds.targets[keep, t], preds.outputs[keep][:, [t]], ids)
            )
        return views

    def contribution_maps(self, contributions: np.ndarray) -> dict[str, np.ndarray]:
        return {c: contributions[:, t] * self.scaling.std[t] for t, c in enumerate(self.columns)}

    def heatmap_maps(
        self, contributions: np.ndarray, output: np.ndarray
    ) -> list[tuple[str, np.ndarray, str]]:
        maps = self.contribution_maps(contributions)
        one = len(self.columns) == 1
        return [
            ("" if one else f".{c}", maps[c], f"{c} = {output[t]:.3g}") for t, c in enumerate(self.columns)
        ]

    def heatmap_scale(self, suffix: str, output: np.ndarray) -> str:
        from wsi.pipelines.inputs.heatmaps import value_scale

        return value_scale(suffix.removeprefix(".") or self.columns[0])


def _nan_inf(value: float) -> float:
    return math.inf if math.isnan(value) else value


__all__ = ["ContinuousTargets", "RegressionKind", "check_continuous", "tertile"]

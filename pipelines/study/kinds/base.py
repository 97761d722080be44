"""The base of every task kind (`TaskKind`), the prediction sets they score (`PredictionSet`,
`TargetView`) and the small helpers the kinds share. See `pipelines.kinds` for what a kind is."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypedDict

import numpy as np
import torch

from wsi.core.errors import LabelError
from wsi.core.files import write_csv_atomic
from wsi.pipelines.inputs import Item
from wsi.pipelines.stats import estimable
from wsi.pipelines.study.tasks import TaskConfig


@dataclass
class PredictionSet:
    """One set of cases with their labels and the model's outputs: a test split, a fold, a cohort."""

    name: str  # "test", "fold-2", "pooled", "external": how the report labels it
    ids: list[str]  # case ids (slides, or patients at patient level)
    targets: np.ndarray  # (n, T) float, NaN = missing; the kind's target_names
    outputs: np.ndarray  # (n, K) float; the kind's output_columns
    groups: np.ndarray | None = None  # (n,) bool: survival's high-risk group, when a cut-off made one

    def __len__(self) -> int:
        return len(self.ids)

    @staticmethod
    def pool(sets: Sequence[PredictionSet], name: str = "pooled") -> PredictionSet:
        """Every set's cases in one (cross-validation: each case once, from the fold that tested it)."""
        groups = [s.groups for s in sets]
        return PredictionSet(
            name=name,
            ids=[i for s in sets for i in s.ids],
            targets=np.concatenate([s.targets for s in sets]),
            outputs=np.concatenate([s.outputs for s in sets]),
            groups=None if any(g is None for g in groups) else np.concatenate(groups),  # type: ignore[arg-type]
        )


@dataclass
class TargetView:
    """One categorical or continuous target of a prediction set, over the cases labelled for it: what
    the report draws (ROC and PR curves, or a scatter plot) per target."""

    column: str  # the target's column; "" for a categorical task's one label
    type: str  # "categorical" | "continuous"
    classes: tuple[str, ...]  # categorical: the class names
    y: np.ndarray  # (m,) class index or value of the labelled cases
    outputs: np.ndarray  # (m, width) probabilities, or (m, 1) predicted value
    ids: list[str]  # the labelled cases

    def metrics_of(self, figures: Mapping[str, Any]) -> Mapping[str, Any]:
        """This target's figures within a set's metrics (a task's only label: the top level)."""
        return figures if not self.column else (figures.get("targets") or {}).get(self.column, {})


class FittedValues(TypedDict, total=False):
    """What a kind fits on the training split and predict reads back (the run's fitted.json)."""

    risk_cutoff: float | None  # survival: the training split's median risk
    target_scaling: dict[str, list[float]]  # regression, multi-target: column -> [mean, sd] (standardize)


def read_fitted_values(values: Mapping[str, Any] | None) -> FittedValues:
    """The known entries of a fitted.json mapping (a run trained by this version or an earlier one)."""
    out: FittedValues = {}
    if values and "risk_cutoff" in values:
        out["risk_cutoff"] = values["risk_cutoff"]
    if values and "target_scaling" in values:
        out["target_scaling"] = values["target_scaling"]
    return out


class TaskKind:
    """Base of every kind: the shared plumbing; subclasses fill in the kind-specific parts."""

    name: ClassVar[str]
    group_bags: int = 1  # bags whose logits form one loss (survival: a risk set)
    uses_training_outputs: ClassVar[bool] = False  # fit_outputs wants the best model's training outputs
    headline: ClassVar[str] = ""  # the figure a one-line summary leads with (metrics.json key)
    val_columns: ClassVar[tuple[str, ...]] = ()  # log.csv columns after val_loss
    summary_keys: ClassVar[tuple[str, ...]] = ()  # top-level figures a cross-validation summarises

    def __init__(self, task: TaskConfig, fitted: Mapping[str, Any] | None = None) -> None:
        self.task = task
        self.fitted_values = read_fitted_values(fitted)

    # -- what the targets and outputs are -------------------------------------------------------------
    @property
    def target_names(self) -> tuple[str, ...]:
        """Names of `Item.target`'s entries (also the label columns of prediction CSVs)."""
        raise NotImplementedError

    @property
    def output_names(self) -> tuple[str, ...]:
        """One name per logit of the model."""
        raise NotImplementedError

    @property
    def num_outputs(self) -> int:
        return len(self.output_names)

    @property
    def output_columns(self) -> tuple[str, ...]:
        """Names of the `outputs` columns (what prediction CSVs hold per case)."""
        raise NotImplementedError

    # -- label tables ---------------------------------------------------------------------------------
    def label_columns(self) -> tuple[str, ...]:
        """Columns a label table must have besides the slide / patient ones."""
        return self.target_names

    def parse_labels(self, record: Mapping[str, str | None]) -> tuple[float, ...]:
        """A label-table row as the target vector; ValueError with the reason for a bad cell."""
        return self.parse_cells([record.get(c) for c in self.label_columns()])

    def parse_cells(self, cells: Sequence[str | None]) -> tuple[float, ...]:
        """The label cells (in `label_columns` order) as the target vector."""
        raise NotImplementedError

    def format_target(self, target: Sequence[float]) -> list[str]:
        """The target vector as CSV cells (the inverse of `parse_labels`)."""
        return ["" if math.isnan(v) else f"{v:g}" for v in target]

    def stratum(self, target: Sequence[float]) -> int:
        """The group a split keeps balanced (a class, the event, a tertile)."""
        return 0

    def set_strata(self, items: Sequence[Item]) -> None:
        """Fit what `stratum` needs on the whole cohort (regression: the tertiles)."""

    def check_cohort(self, items: Sequence[Item], where: str) -> None:
        """Refuse a cohort too small to split and score (LabelError naming what is short)."""
        patients = {it.group for it in items}
        if len(patients) < 3:
            raise LabelError(f"{where}: {len(patients)} patient(s) with an input; a split needs at least 3")

    # -- learning -------------------------------------------------------------------------------------
    def fit(self, train: Sequence[Item], device: torch.device) -> None:
        """Fit what the loss needs on the training split (standardisation, class weights)."""

    def fit_outputs(self, outputs: np.ndarray) -> None:
        """Fit what is read off the trained model's outputs on its training split (a risk cut-off)."""

    def fitted(self) -> dict[str, Any]:
        """The fitted values predict needs (saved in the run folder's fitted.json). A plain dict: the run
        record's writer and predict's ensemble (pipelines/train, pipelines/predict) take it as one."""
        return dict(self.fitted_values)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """logits (B, C) float32, targets (B, T) float32, labels (B,) int64 -> scalar loss."""
        raise NotImplementedError

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, C) logits -> (B, K) outputs in the labels' units (probabilities, values, risk)."""
        raise NotImplementedError

    # -- figures --------------------------------------------------------------------------------------
    def validation(
        self, targets: np.ndarray, outputs: np.ndarray, logits: np.ndarray
    ) -> tuple[float, dict[str, float], tuple[float, float]]:
        """(val loss, the val_columns' values, the score that picks the best epoch: larger wins)."""
        raise NotImplementedError

    def evaluate(self, preds: PredictionSet, *, n_bootstrap: int, seed: int) -> dict[str, Any]:
        """Every figure of a held-out set with 95% intervals, JSON-ready (NaN becomes None)."""
        raise NotImplementedError

    def summary_line(self, metrics: Mapping[str, Any]) -> str:
        """One line for the command line: the headline figure and its interval."""
        return f"{self.headline} {figure_text(metrics, self.headline)}"

    def target_views(self, preds: PredictionSet) -> list[TargetView]:
        """The set per categorical / continuous target (survival has none: it draws its own figures)."""
        return []

    def high_risk(self, preds: PredictionSet) -> np.ndarray | None:
        """(n,) bool high-risk group of a survival set; None for other kinds or without a cut-off."""
        return None

    # -- interpretation -------------------------------------------------------------------------------
    def contribution_maps(self, contributions: np.ndarray) -> dict[str, np.ndarray]:
        """(N, C) per-logit tile contributions -> {output: (N,) each tile's push towards it}."""
        raise NotImplementedError

    def heatmap_maps(
        self, contributions: np.ndarray, output: np.ndarray
    ) -> list[tuple[str, np.ndarray, str]]:
        """The maps drawn for one case: (file suffix, (N,) values, title part); suffix "" = the main one."""
        raise NotImplementedError

    def heatmap_scale(self, suffix: str, output: np.ndarray) -> str:
        """What a value of the map `suffix` (of `heatmap_maps`) means, for its colour bar: the unit, the
        direction of each colour, and what the values add up to."""
        from wsi.pipelines.inputs.heatmaps import CONTRIBUTION_LABEL

        return CONTRIBUTION_LABEL

    # -- prediction files -----------------------------------------------------------------------------
    def derived_columns(self) -> tuple[str, ...]:
        """Columns after the outputs (predicted class, risk group)."""
        return ()

    def derived_cells(self, output: np.ndarray) -> list[str]:
        return []

    def write_predictions(self, path: Path, preds: PredictionSet, *, id_column: str = "slide") -> None:
        header = [id_column, *self.target_names, *self.output_columns, *self.derived_columns()]
        rows = (
            [cid, *self.format_target(t), *[f"{v:.6f}" for v in o], *self.derived_cells(o)]
            for cid, t, o in zip(preds.ids, preds.targets, preds.outputs, strict=True)
        )
        write_csv_atomic(path, header, rows)

    def read_predictions(self, path: Path, name: str) -> PredictionSet:
        """A predictions CSV written by `write_predictions` back as a set (cross-validation pooling)."""
        with Path(path).open(newline="", encoding="utf-8") as fh:
            records = list(csv.DictReader(fh))
        id_column = next(iter(records[0])) if records else "slide"
        targets = [self.parse_cells([r.get(c) for c in self.target_names]) for r in records]
        outputs = [[float(r[c]) for c in self.output_columns] for r in records]
        shape_t, shape_o = (len(records), len(self.target_names)), (len(records), len(self.output_columns))
        has_groups = bool(records) and "risk_group" in records[0]  # survival with a cut-off
        groups = np.array([r["risk_group"] == "high" for r in records]) if has_groups else None
        return PredictionSet(
            name=name,
            ids=[r[id_column] for r in records],
            targets=np.array(targets, dtype=np.float64).reshape(shape_t),
            outputs=np.array(outputs, dtype=np.float64).reshape(shape_o),
            groups=groups,
        )


def figure_text(metrics: Mapping[str, Any], key: str) -> str:
    """`0.812 (95% CI 0.70-0.91)`, or what is not estimable and why (pipelines.stats.estimable)."""
    lo, hi = metrics.get(f"{key}_ci95") or [None, None]
    return estimable.describe(metrics, key, fmt3(metrics.get(key)), f"{fmt3(lo)}-{fmt3(hi)}")


def fmt3(value: Any) -> str:
    """A figure for a log line: 3 decimals, or n/a when undefined."""
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def loss_over_set(kind: TaskKind, targets: np.ndarray, logits: np.ndarray) -> float:
    """The kind's loss over a whole set of cases at once (validation), on the CPU; NaN for none."""
    if len(targets) == 0:
        return math.nan
    with torch.no_grad():
        t = torch.as_tensor(targets, dtype=torch.float32)
        labels = torch.nan_to_num(t[:, 0], nan=-1.0).long()
        return float(kind.loss(torch.as_tensor(logits, dtype=torch.float32), t, labels))


def nanmean(values: Sequence[float | None]) -> float:
    """Mean of the defined values (None and NaN left out); NaN when none is."""
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def worst_if_nan(value: float) -> float:
    """A figure as a score component: NaN (undefined on this split) ranks below everything."""
    return -math.inf if math.isnan(value) else value


def parse_number(text: str | None, column: str) -> float:
    """A numeric label cell; blank (or NA / NaN) is missing (NaN)."""
    cell = (text or "").strip()
    if cell.lower() in ("", "na", "nan", "n/a", "none", "null", "."):
        return math.nan
    try:
        value = float(cell)
    except ValueError:
        raise ValueError(f"{column} {cell!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{column} {cell!r} is not a finite number")
    return value


__all__ = [
    "FittedValues",
    "PredictionSet",
    "TargetView",
    "TaskKind",
    "figure_text",
    "fmt3",
    "loss_over_set",
    "nanmean",
    "parse_number",
    "read_fitted_values",
    "worst_if_nan",
]

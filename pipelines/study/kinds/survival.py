"""`kind: survival`: time to an event (overall or progression-free survival) from a Cox model.

The model's one output is a risk score (a Cox linear predictor: higher = earlier event). A Cox loss
ranks the bags of a set against each other, so the training loop collects `survival.bags_per_step`
bags before each loss (`group_bags`); validation C-index picks the best epoch (ties by the Cox loss of
the whole validation set). The test split reports Harrell's C-index and time-dependent AUCs with 95%
bootstrap intervals, and the log-rank test of the cases above against below the training split's
median risk (`risk_cutoff`, saved with the run, so an external cohort is split the same way).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from wsi.core.errors import LabelError
from wsi.pipelines.inputs import Item
from wsi.pipelines.stats import estimable
from wsi.pipelines.stats import survival as surv_stats
from wsi.pipelines.study.kinds import (
    KINDS,
    PredictionSet,
    TaskKind,
    figure_text,
    loss_over_set,
    parse_number,
    worst_if_nan,
)
from wsi.pipelines.study.kinds.losses import cox_partial_nll

log = logging.getLogger(__name__)

_EVENT_WORDS = {
    **dict.fromkeys(("1", "1.0", "true", "yes", "y", "dead", "deceased", "died", "event", "progressed"), 1.0),
    **dict.fromkeys(("0", "0.0", "false", "no", "n", "alive", "living", "censored", "none"), 0.0),
}


def parse_event(text: str | None, column: str) -> float:
    """An event flag: 1/0, true/false, yes/no, dead/alive..., or cBioPortal's "1:DECEASED"."""
    cell = (text or "").strip().lower()
    if ":" in cell:  # cBioPortal: "1:DECEASED", "0:LIVING", "1:Recurred/Progressed"
        cell = cell.split(":", 1)[0].strip()
    if cell in ("", "na", "nan", "n/a", "null", "."):
        return math.nan
    if cell not in _EVENT_WORDS:
        raise ValueError(f"{column} {text!r} is not an event flag (1/0, true/false, dead/alive)")
    return _EVENT_WORDS[cell]


@KINDS.register("survival")
class SurvivalKind(TaskKind):
    name: ClassVar[str] = "survival"
    headline: ClassVar[str] = "c_index"
    val_columns: ClassVar[tuple[str, ...]] = ("val_cindex",)
    summary_keys: ClassVar[tuple[str, ...]] = ("c_index", "logrank_p")
    uses_training_outputs: ClassVar[bool] = True

    def __init__(self, task: Any, fitted: Mapping[str, Any] | None = None) -> None:
        super().__init__(task, fitted)
        self.options = task.survival_options
        self.group_bags = self.options.bags_per_step
        self._said_val_cindex = False  # the validation C-index's "not estimable" is said once per fold

    @property
    def target_names(self) -> tuple[str, ...]:
        return (self.options.time, self.options.event)

    @property
    def output_names(self) -> tuple[str, ...]:
        return ("risk",)

    @property
    def output_columns(self) -> tuple[str, ...]:
        return ("risk",)

    @property
    def risk_cutoff(self) -> float | None:
        value = self.fitted_values.get("risk_cutoff")
        return None if value is None else float(value)

    def fit_outputs(self, outputs: np.ndarray) -> None:
        """The training split's median risk: the cut between high and low risk on any later cohort."""
        risk = outputs[:, 0][np.isfinite(outputs[:, 0])]
        if len(risk):
            self.fitted_values["risk_cutoff"] = float(np.median(risk))

    def parse_cells(self, cells: Sequence[str | None]) -> tuple[float, ...]:
        time = parse_number(cells[0], self.options.time)
        if time <= 0:
            raise ValueError(f"{self.options.time} {cells[0]!r} is not a positive time")
        event = parse_event(cells[1], self.options.event)
        if math.isnan(time) or math.isnan(event):  # half a label is no label
            return (math.nan, math.nan)
        return (time, event)

    def format_target(self, target: Sequence[float]) -> list[str]:
        if math.isnan(target[0]):
            return ["", ""]
        return [f"{target[0]:g}", str(int(target[1]))]

    def stratum(self, target: Sequence[float]) -> int:
        return -1 if math.isnan(target[1]) else int(target[1])

    def check_cohort(self, items: Sequence[Item], where: str) -> None:
        super().check_cohort(items, where)
        events = {it.group for it in items if it.target[1] == 1.0}
        if len(events) < 2:
            raise LabelError(
                f"{where}: {len(events)} patient(s) with an event ({self.options.event} = 1); a Cox model "
                "needs events to rank"
            )

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        known = torch.isfinite(targets[:, 0])  # cases without follow-up take no part
        return cox_partial_nll(logits[known, 0], targets[known, 0], targets[known, 1], ties=self.options.ties)

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits[:, :1].float()

    def validation(
        self, targets: np.ndarray, outputs: np.ndarray, logits: np.ndarray
    ) -> tuple[float, dict[str, float], tuple[float, float]]:
        val_loss = loss_over_set(self, targets, logits)
        keep = np.isfinite(targets[:, 0]) if len(targets) else np.zeros(0, dtype=bool)
        c, pairs = (
            surv_stats.concordance(targets[keep, 0], targets[keep, 1], outputs[keep, 0])
            if keep.any()
            else (math.nan, 0)
        )
        why = estimable.val_cindex_reason(int(keep.sum()), pairs)
        if why:  # a C-index of one or two pairs reads 0.000 or 1.000 and picks an epoch by chance
            c = math.nan
            if not self._said_val_cindex:
                log.warning("%s", why)
                self._said_val_cindex = True
        return (
            val_loss,
            {"val_cindex": c},
            (worst_if_nan(c), -val_loss if not math.isnan(val_loss) else -math.inf),
        )

    def high_risk(self, preds: PredictionSet) -> np.ndarray | None:
        """(n,) bool: above the training median risk (the set's own groups when it carries them)."""
        if preds.groups is not None:
            return preds.groups
        cutoff = self.risk_cutoff
        return None if cutoff is None else preds.outputs[:, 0] > cutoff

    def evaluate(self, preds: PredictionSet, *, n_bootstrap: int, seed: int) -> dict[str, Any]:
        horizons = np.asarray(self.options.auc_times, dtype=np.float64)
        figures = surv_stats.evaluate_survival(
            preds.targets[:, 0], preds.targets[:, 1], preds.outputs[:, 0], high_risk=self.high_risk(preds),
            horizons=horizons, n_bootstrap=n_bootstrap, seed=seed,
        )  # fmt: skip
        if self.risk_cutoff is not None and preds.groups is None:
            figures["risk_cutoff"] = self.risk_cutoff
        return {**figures, "time_unit": self.options.time_unit}

    def summary_line(self, metrics: Mapping[str, Any]) -> str:
        line = f"C-index {figure_text(metrics, 'c_index')}"
        if metrics.get("logrank_p") is not None:
            line += f", log-rank p {metrics['logrank_p']:.3g} (split at the training median risk)"
        return line

    def contribution_maps(self, contributions: np.ndarray) -> dict[str, np.ndarray]:
        return {"risk": contributions[:, 0]}

    def heatmap_maps(
        self, contributions: np.ndarray, output: np.ndarray
    ) -> list[tuple[str, np.ndarray, str]]:
        return [("", contributions[:, 0], f"risk {output[0]:.3f}")]

    def heatmap_scale(self, suffix: str, output: np.ndarray) -> str:
        from wsi.pipelines.inputs.heatmaps import RISK_SCALE

        return RISK_SCALE

    def derived_columns(self) -> tuple[str, ...]:
        return ("risk_group",) if self.risk_cutoff is not None else ()

    def derived_cells(self, output: np.ndarray) -> list[str]:
        cutoff = self.risk_cutoff
        if cutoff is None:
            return []
        return ["" if not np.isfinite(output[0]) else "high" if output[0] > cutoff else "low"]


__all__ = ["SurvivalKind", "parse_event"]

"""Task kinds: what a task's model outputs mean, how they are learned, and how they are scored.

The model returns logits (B, C) with C = `num_outputs` for every kind; a kind says what those numbers
are (class scores, standardised targets, a Cox risk), which loss trains them, how many bags one loss
needs (`group_bags`: a Cox loss compares bags), which figures pick the best epoch and which the test
split reports. Training, `wsi predict` and the report all ask the kind, so a new kind is one module here.
A case's label is a float vector `Item.target` (NaN = missing) in the kind's `target_names` order:
categorical (class index,), regression (each value,), survival (time, event), multi-target (each).
`KINDS` maps the task's `kind:` to its class; `build_kind(task, fitted)` builds one, with the values
fitted on a training split (`fit`) or read back from a run folder (`fitted`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wsi.core.registry import Registry
from wsi.pipelines.study.kinds.base import (
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
from wsi.pipelines.study.tasks import TaskConfig

KINDS: Registry[type[TaskKind]] = Registry(
    "task kind",
    modules=(
        "wsi.pipelines.study.kinds.categorical",
        "wsi.pipelines.study.kinds.regression",
        "wsi.pipelines.study.kinds.survival",
        "wsi.pipelines.study.kinds.multi",
    ),
)


def build_kind(task: TaskConfig, fitted: Mapping[str, Any] | None = None) -> TaskKind:
    """The kind of `task`, with values fitted on a training split (from a run folder's fitted.json)."""
    return KINDS.get(task.kind)(task, fitted)


__all__ = [
    "KINDS",
    "PredictionSet",
    "TargetView",
    "TaskKind",
    "build_kind",
    "figure_text",
    "fmt3",
    "loss_over_set",
    "nanmean",
    "parse_number",
    "worst_if_nan",
]

"""Task kinds: what a task's model outputs mean, how they are learned, and how they are scored.

The attention model is the same for every kind: it returns logits (B, C) with C = `num_outputs`. A
kind says what those C numbers are (class scores, standardised targets, a Cox risk), which loss
trains them, how many bags one loss needs (`group_bags`: a Cox loss compares bags, so it needs a set
of them), which figures pick the best epoch and which ones the test split reports. Training, `wsi
predict` and the statistics report all ask the kind, so a new kind is one module here.

Every case (a slide, or a patient at `level: patient`) carries its label as a target vector
`Item.target` of floats (NaN = missing) in the kind's `target_names` order:

  categorical    (class index,)
  regression     (value of each target,)
  survival       (time, event)
  multi-target   (class index or value of each target,)

`KINDS` (a `wsi.core.registry.Registry`) maps the task's `kind:` to its class; `build_kind(task, fitted)`
builds one, with the values fitted on a training split (`fit`: standardisation, class weights) or
read back from a run folder (`fitted`: what `fitted()` returned when that run trained).
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

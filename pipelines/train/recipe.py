"""Training recipes: the values a task's unset (None) fields take, and the preset sized to the cohort.

A task names its recipe (`recipe: small-cohort`, the default, or `recipe: paper`); every field it leaves
None (`pipelines.tasks`) is filled here when training starts, once the number of training cases is
known, and the run record keeps the filled task. A value written in the task YAML always wins.

paper          for TCGA-scale cohorts: whole bags, the preset as named (vit-wsi) and at most 100
               epochs are the seqnorm paper's (000_980e28d087b08f12.txt, sec. 3.1); AdamW 1e-4 with
               weight decay 1e-2 and no schedule, the best epoch by the validation figure
               (categorical: AUROC) and patience 10 are ours: the paper's text names no optimizer.
small-cohort   for cohorts of tens to a few hundred cases, where a 3.4M-parameter transformer
               memorises the training bags within a few epochs and the AUROC of ~15 validation bags
               picks an epoch by chance. It regularises what peers' MIL recipes regularise: random
               tile subsets of each training bag (feature bags only; at least 16 tiles, so small bags
               stay whole), input feature dropout and model dropout, weight decay on weight matrices
               only, a warm-up then cosine schedule (peak lr 5e-4 for the MIL transformer, 2e-4 for
               ABMIL and the image ViTs); it keeps the weights of the lowest validation loss averaged
               over a window of epochs (and averages the weights over that window), and below
               `SMALL_BELOW` training cases uses the narrower one-layer `vit-wsi-small` preset,
               which reads the bag by gated attention pooling over its tile tokens and starts its
               attention residual small (LayerScale 0.01): with a class token, one telling tile
               among dozens was not learned from ~100 bags (docs/benchmarks.md).

The model preset is chosen here and nowhere else (`resolve_preset`): a task trained on slide embeddings
(`pipelines.train.slide_level`) trains a head, `linear` unless it names one (`linear`, `mlp`); any
other task keeps the preset it names, else gets one by the sizing rule.

Sizing rule (`preset_for`): a task that names no preset gets `vit-wsi` with the paper recipe; with
small-cohort it gets `vit-wsi-small` when its training split (the smallest over cross-validation folds)
holds fewer than `SMALL_BELOW` = 300 cases, else `vit-wsi`. An image task gets `vit-2d`, or `vit-3d`
when its `input_options.size_px` is [D, H, W] (vit-wsi reads feature bags, not images).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wsi.pipelines.study.tasks import ModelOverrides, TaskConfig
from wsi.pipelines.train.slide_level import DEFAULT_HEAD, HEAD_KINDS

log = logging.getLogger(__name__)

#: below this many training cases the small-cohort recipe picks the narrower preset
SMALL_BELOW = 300
SMALL_PRESET = "vit-wsi-small"
FULL_PRESET = "vit-wsi"
IMAGE_PRESETS = {2: "vit-2d", 3: "vit-3d"}  # image tasks naming no preset: by input_options.size_px


@dataclass(frozen=True)
class RecipeValues:
    """What one recipe fills in; each field names the task field it fills."""

    epochs: int  # epochs
    patience: int  # patience
    lr: float  # optimizer.lr
    weight_decay: float  # optimizer.weight_decay (weight matrices only, models.param_groups)
    scheduler: str  # optimizer.scheduler
    warmup_epochs: int  # optimizer.warmup_epochs
    tile_fraction: tuple[float, float]  # augment.tile_fraction ((1, 1) = whole bags)
    feature_dropout: float  # augment.feature_dropout
    metric: str  # selection.metric
    window: int  # selection.window
    average_weights: bool  # selection.average_weights
    # model.overrides added per model kind unless the task gives the key (empty: the preset's values)
    model_overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    lr_by_kind: Mapping[str, float] = field(default_factory=dict)  # optimizer.lr per model kind (else lr)


RECIPES: dict[str, RecipeValues] = {
    "paper": RecipeValues(
        epochs=100, patience=10, lr=1e-4, weight_decay=1e-2, scheduler="none", warmup_epochs=0,
        tile_fraction=(1.0, 1.0), feature_dropout=0.0, metric="val-figure", window=1,
        average_weights=False,
    ),
    "small-cohort": RecipeValues(
        epochs=100, patience=30, lr=2e-4, weight_decay=5e-2, scheduler="cosine", warmup_epochs=5,
        tile_fraction=(0.5, 1.0), feature_dropout=0.1, metric="smoothed-val-loss", window=5,
        average_weights=True,
        model_overrides={
            "mil": {"dropout": 0.1},
            "vit2d": {"dropout": 0.1},
            "vit3d": {"dropout": 0.1},
            "abmil": {"dropout": 0.25, "attention_dropout": 0.1},
        },
        # The MIL transformer normalises its tokens and takes 5e-4 in stride; ABMIL sees raw features
        # (Musk's are integers in the hundreds) and falls apart at 5e-4 (docs/benchmarks.md).
        lr_by_kind={"mil": 5e-4},
    ),
}  # fmt: skip


def preset_for(
    recipe: str, n_train: int, input_name: str = "bags", input_options: Mapping[str, Any] | None = None
) -> str:
    """The preset a task that names none trains (the sizing rule in the module docstring)."""
    if input_name == "images":  # vit-wsi reads feature bags: an image task's own ViT, by its dimensions
        size = (input_options or {}).get("size_px")
        return IMAGE_PRESETS[3 if isinstance(size, list | tuple) and len(size) == 3 else 2]
    if recipe == "small-cohort" and input_name == "bags" and n_train < SMALL_BELOW:
        return SMALL_PRESET
    return FULL_PRESET


def resolve_preset(task: TaskConfig, n_train: int) -> tuple[str, ModelOverrides]:
    """The preset the task trains and the task's model overrides that still apply to it (the rule in
    the module docstring): a MIL preset's overrides (depth, dim) mean nothing to a head."""
    from wsi.models.presets import preset_kind

    preset = task.model.preset
    if task.input != "slide-embeddings":
        chosen = preset or preset_for(task.recipe, n_train, task.input, task.input_options)
        return chosen, dict(task.model.overrides)
    if preset is not None and preset_kind(preset) in HEAD_KINDS:
        return preset, dict(task.model.overrides)
    log.info("slide embeddings: training the %s head on them (task preset: %s)", DEFAULT_HEAD, preset)
    return DEFAULT_HEAD, {}


def apply_recipe(task: TaskConfig, *, n_train: int) -> TaskConfig:
    """`task` with its preset chosen and every None field filled from its recipe; `n_train` = training
    cases (per fold)."""
    from wsi.models.presets import preset_attention, preset_kind

    values = RECIPES[task.recipe]
    preset, task_overrides = resolve_preset(task, n_train)
    overrides = {**values.model_overrides.get(preset_kind(preset), {}), **task_overrides}
    defaults: dict[str, Any] = {
        "epochs": values.epochs,
        "patience": values.patience,
        "optimizer.lr": values.lr_by_kind.get(preset_kind(preset), values.lr),
        "optimizer.weight_decay": values.weight_decay,
        "optimizer.scheduler": values.scheduler,
        "optimizer.warmup_epochs": values.warmup_epochs,
        "augment.tile_fraction": list(values.tile_fraction),
        "augment.feature_dropout": values.feature_dropout,
        "selection.metric": values.metric,
        "selection.window": values.window,
        "selection.average_weights": values.average_weights,
    }
    changes = {key: value for key, value in defaults.items() if _get(task, key) is None}
    changes["model.preset"] = str(preset)
    changes["model.attention"] = task.model.attention or preset_attention(preset)
    changes["model.overrides"] = overrides
    return task.replace(**changes)


def is_resolved(task: TaskConfig) -> bool:
    """Whether every field a recipe fills has a value (what the training loop needs)."""
    keys = ("epochs", "patience", "optimizer.lr", "optimizer.weight_decay", "optimizer.scheduler",
            "optimizer.warmup_epochs", "augment.tile_fraction", "augment.feature_dropout",
            "selection.metric", "selection.window", "selection.average_weights", "model.preset")  # fmt: skip
    return all(_get(task, key) is not None for key in keys)


def _get(task: TaskConfig, dotted: str) -> Any:
    node: Any = task
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


__all__ = ["FULL_PRESET", "IMAGE_PRESETS", "RECIPES", "SMALL_BELOW", "SMALL_PRESET", "RecipeValues",
           "apply_recipe", "is_resolved", "preset_for", "resolve_preset"]  # fmt: skip

"""Training recipes: the values a task's unset (None) fields take, and the preset sized to the cohort.

A task names its recipe; every field it leaves None (`pipelines.study.tasks`) is filled here when
training starts, once the number of training cases is known, and the run record keeps the filled task.
A value in the task YAML always wins; `wsi train --recipe R` puts R's values in place of the task's own.
`paper`: the seqnorm paper's whole bags, vit-wsi and at most 100 epochs (000_980e28d087b08f12.txt,
sec. 3.1), with our AdamW 1e-4 (the paper names no optimizer). `small-cohort` (the default): what
peers' MIL recipes regularise, for tens to a few hundred cases. `authors`: a baseline's authors' own,
read from configs/recipes/<preset>.yaml with each value's source file and line. What each fills, and
why: docs/training.md. The model preset is chosen here and nowhere else (`resolve_preset`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from wsi import configs
from wsi.core.config import Fraction, config_model, parse_config
from wsi.core.errors import ConfigError
from wsi.core.renamed import new_names
from wsi.pipelines.study.tasks import MAX_EPOCHS, Epochs, ModelOverrides, TaskConfig
from wsi.pipelines.train.model_settings import refuse_untaken, resolve_model_settings
from wsi.pipelines.train.slide_level import DEFAULT_HEAD, HEAD_KINDS

log = logging.getLogger(__name__)

#: below this many training cases the small-cohort recipe picks the narrower preset
SMALL_BELOW = 300
SMALL_PRESET = "vit-wsi-small"
FULL_PRESET = "vit-wsi"
IMAGE_PRESETS = {2: "vit-2d", 3: "vit-3d"}  # image tasks naming no preset: by input_options.size_px

_Count = Annotated[int, Field(ge=0, le=MAX_EPOCHS)]
_Lr = Annotated[float, Field(gt=0, le=10)]
_Decay = Annotated[float, Field(ge=0, le=10)]
_Beta = Annotated[float, Field(ge=0, lt=1)]
_Share = Annotated[float, Field(gt=0, le=1)]


@config_model
@dataclass(frozen=True)
class RecipeValues:
    """What one recipe fills in (`TASK_FIELDS` names the task field of each); an authors' recipe file
    (configs/recipes/<preset>.yaml) holds these keys."""

    epochs: Epochs
    patience: _Count
    lr: _Lr
    weight_decay: _Decay
    schedule: Literal["none", "cosine", "cosine-epochs", "multistep"]
    optimizer: Literal["adamw", "adam", "lookahead-radam"] = "adamw"
    betas: tuple[_Beta, _Beta] | None = None  # None: the optimizer's (0.9, 0.999)
    weight_decay_on: Literal["matrices", "all", "not-1d"] = "matrices"
    min_lr: Annotated[float, Field(ge=0, le=10)] = 0.0
    milestones: tuple[Annotated[int, Field(ge=1, le=MAX_EPOCHS)], ...] = ()
    gamma: Annotated[float, Field(gt=0, le=1)] = 0.1
    warmup_epochs: _Count = 0
    tile_fraction: tuple[_Share, _Share] = (1.0, 1.0)  # (1, 1) = whole bags
    feature_dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    metric: Literal["val-figure", "smoothed-val-loss", "auroc-plus-accuracy"] = "val-figure"
    window: Annotated[int, Field(ge=1, le=1000)] = 1
    average_weights: bool = False
    after_share: Fraction = 0.0
    min_epochs: _Count = 0
    grad_accum: Annotated[int, Field(ge=1, le=65_536)] = 1
    sampling: Literal["shuffle", "balanced"] = "shuffle"
    model: ModelOverrides = field(default_factory=dict)  # an authors' file: the preset's model settings
    # model.overrides added per model kind unless the task gives the key (empty: the preset's values)
    model_overrides: dict[str, ModelOverrides] = field(default_factory=dict)
    lr_by_kind: dict[str, _Lr] = field(default_factory=dict)  # optimizer.lr per model kind (else lr)
    source: str = ""  # an authors' file: the repository and commit its values were read from

    OLD_NAMES: ClassVar[dict[str, str]] = {"scheduler": "schedule"}  # recipe files before the rename

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return new_names(cls, data)


#: RecipeValues field -> the task field it fills (when the task leaves it None)
TASK_FIELDS = {
    "epochs": "epochs", "patience": "patience", "min_epochs": "min_epochs", "grad_accum": "grad_accum",
    "sampling": "sampling", "optimizer": "optimizer.name", "lr": "optimizer.lr",
    "betas": "optimizer.betas", "weight_decay": "optimizer.weight_decay",
    "weight_decay_on": "optimizer.weight_decay_on", "schedule": "optimizer.schedule",
    "min_lr": "optimizer.min_lr", "milestones": "optimizer.milestones", "gamma": "optimizer.gamma",
    "warmup_epochs": "optimizer.warmup_epochs", "tile_fraction": "augment.tile_fraction",
    "feature_dropout": "augment.feature_dropout", "metric": "selection.metric",
    "window": "selection.window", "average_weights": "selection.average_weights",
    "after_share": "selection.after_share",
}  # fmt: skip
#: the task fields a recipe fills (`wsi train --recipe R` resets them to R's)
RECIPE_FIELDS = tuple(TASK_FIELDS.values())
_MAY_STAY_NONE = {"optimizer.betas"}  # None is a resolved value: the optimizer's own

RECIPES: dict[str, RecipeValues] = {
    "paper": RecipeValues(
        epochs=100, patience=10, lr=1e-4, weight_decay=1e-2, schedule="none", warmup_epochs=0,
        tile_fraction=(1.0, 1.0), feature_dropout=0.0, metric="val-figure", window=1,
        average_weights=False,
    ),
    "small-cohort": RecipeValues(
        epochs=100, patience=30, lr=2e-4, weight_decay=5e-2, schedule="cosine", warmup_epochs=5,
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


def authors_presets() -> list[str]:
    """The presets with an authors' recipe file (configs/recipes/)."""
    return configs.available("recipes")


def authors_recipe(preset: str) -> RecipeValues:
    """The authors' recipe of a packaged baseline preset (configs/recipes/<preset>.yaml)."""
    names = authors_presets()
    if preset not in names:
        raise ConfigError(
            f"recipe authors: preset {preset} has no authors' recipe (configs/recipes/); those with one: "
            f"{', '.join(names)}. Choose one of them (--preset), or recipe small-cohort or paper"
        )
    data, source = configs.load_yaml("recipes", preset)
    return parse_config(RecipeValues, data, source=source)


def recipe_values(recipe: str, preset: str) -> RecipeValues:
    """The values `recipe` fills for `preset`."""
    return authors_recipe(preset) if recipe == "authors" else RECIPES[recipe]


def preset_for(
    recipe: str, n_train: int, input_name: str = "bags", input_options: Mapping[str, Any] | None = None
) -> str:
    """The preset a task that names none trains: an image task `vit-2d`, or `vit-3d` when size_px is
    [D, H, W]; with small-cohort, bags and fewer than `SMALL_BELOW` training cases (the smallest over
    cross-validation folds) `vit-wsi-small`; else `vit-wsi`."""
    if input_name == "images":  # vit-wsi reads feature bags: an image task's own ViT, by its dimensions
        size = (input_options or {}).get("size_px")
        return IMAGE_PRESETS[3 if isinstance(size, list | tuple) and len(size) == 3 else 2]
    if recipe == "authors":
        raise ConfigError(
            "recipe authors is a baseline's authors' own: name its preset (--preset "
            f"{' | '.join(authors_presets())})"
        )
    if recipe == "small-cohort" and input_name == "bags" and n_train < SMALL_BELOW:
        return SMALL_PRESET
    return FULL_PRESET


def resolve_preset(task: TaskConfig, n_train: int) -> tuple[str, ModelOverrides]:
    """The preset the task trains and the task's model overrides that still apply to it: on slide
    embeddings a head (`linear` unless the task names `linear` or `mlp`), whose MIL overrides (depth,
    dim) mean nothing; otherwise the preset the task names, else `preset_for`'s."""
    from wsi.models.presets import preset_kind

    preset = task.model.preset
    if task.input != "slide-embeddings":
        chosen = preset or preset_for(task.recipe, n_train, task.input, task.input_options)
        return chosen, dict(task.model.overrides)
    if preset is not None and preset_kind(preset) in HEAD_KINDS:
        return preset, dict(task.model.overrides)
    log.info("slide embeddings: training the %s head on them (task preset: %s)", DEFAULT_HEAD, preset)
    return DEFAULT_HEAD, {}


def apply_recipe(
    task: TaskConfig, *, n_train: int, given: Mapping[str, Any] | None = None
) -> TaskConfig:
    """`task` with its preset chosen, every None field filled from its recipe and its model settings
    settled for the preset (pipelines.train.model_settings); `n_train` = training cases (per fold).
    `given`: the model settings this run's options gave ({"--attention": "gdla"}), refused by name when
    the preset cannot take them."""
    from wsi.models.presets import preset_kind

    preset, task_overrides = resolve_preset(task, n_train)
    if given:
        refuse_untaken(preset, given)
    values = recipe_values(task.recipe, preset)
    kind = preset_kind(preset)
    defaults = {TASK_FIELDS[f.name]: getattr(values, f.name) for f in fields(values) if f.name in TASK_FIELDS}
    defaults["optimizer.lr"] = values.lr_by_kind.get(kind, values.lr)
    changes = {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in defaults.items()
        if _get(task, key) is None
    }
    changes["model.preset"] = str(preset)
    recipe_overrides = {**values.model_overrides.get(kind, {}), **values.model}
    own = task.replace(**{"model.overrides": task_overrides})
    changes.update(resolve_model_settings(own, str(preset), recipe_overrides))
    return task.replace(**changes)


#: what each kind's validation figure is called in a sentence (`selection.metric: val-figure`)
_VAL_FIGURE = {"categorical": "AUROC", "survival": "C-index", "regression": "Pearson r",
               "multi-target": "mean score over the targets"}  # fmt: skip


def describe_recipe(task: TaskConfig, n_train: int) -> str:
    """One sentence on what a resolved task trains and how, in a reader's words: the recipe, the cohort it
    was sized for, the model, how much of each bag a step sees, and which weights are kept."""
    model = task.model.preset or "?"
    attention = task.model.attention
    lo, hi = task.augment.tile_fraction or (1.0, 1.0)
    bags = ("whole bags at every step" if lo >= 1.0
            else f"a random {lo:.0%}-{hi:.0%} of each bag's tiles at every step")  # fmt: skip
    patience = task.patience
    epochs = (f"up to {task.epochs} epochs (stopping after {patience} without improvement)"
              if patience and patience < (task.epochs or 0) else f"{task.epochs} epochs")  # fmt: skip
    window = int(task.selection.window or 1)
    if task.selection.metric == "smoothed-val-loss":
        kept = f"the epoch of lowest validation loss averaged over {window} epochs"
        if task.selection.average_weights:
            kept = f"the weights averaged over the {window} epochs of lowest mean validation loss"
    else:
        kept = f"the epoch of best validation {_VAL_FIGURE.get(task.kind, 'figure')}"
    cases = "case" if n_train == 1 else "cases"
    opt = task.optimizer
    optimizer = f"{opt.name or 'adamw'} at learning rate {opt.lr:g}" if opt.lr is not None else ""
    order = ("each class equally often (bags drawn with replacement)" if task.sampling == "balanced"
             else "each training bag once per epoch")  # fmt: skip
    return (
        f"training recipe {task.recipe!r} for {n_train} training {cases}: model {model}"
        + (f" ({attention} attention)" if attention else "")
        + (f", {optimizer}" if optimizer else "")
        + f", {bags}, {order}, {epochs}; keeps {kept}"
    )


def is_resolved(task: TaskConfig) -> bool:
    """Whether every field a recipe fills has a value (what the training loop needs)."""
    keys = [k for k in RECIPE_FIELDS if k not in _MAY_STAY_NONE] + ["model.preset"]
    return all(_get(task, key) is not None for key in keys)


def _get(task: TaskConfig, dotted: str) -> Any:
    node: Any = task
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


__all__ = ["FULL_PRESET", "IMAGE_PRESETS", "RECIPES", "RECIPE_FIELDS", "SMALL_BELOW", "SMALL_PRESET",
           "TASK_FIELDS", "RecipeValues", "apply_recipe", "authors_presets", "authors_recipe",
           "describe_recipe", "is_resolved", "preset_for", "recipe_values", "resolve_preset"]  # fmt: skip

"""Task configs: a YAML per task (packaged in configs/tasks/ or any path), typed and validated.

A task says what is learned (its `kind`: categorical, regression, survival, multi-target; classes or
targets, label columns), at which `level` (a bag per slide or per patient), from which input, with
which model and how it is trained (docs/training.md). Training follows it and prediction reads it back
from the run record (`pipelines.runs.record`), which is why it lives beside both and not in
`pipelines.train`. Types and unknown keys are checked by `wsi.core.config.parse_config`; the rules
that tie fields together (split fractions summing to 1, at least two classes) are `check_task`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from wsi.configs import load_yaml
from wsi.core.config import MAX_SEED, Fraction, config_model, parse_config, replace_config
from wsi.core.errors import ConfigError
from wsi.core.json_types import JsonObject
from wsi.core.renamed import new_names

Recipe = Literal["small-cohort", "paper", "authors"]

# The ranges of a task's numbers (tests/wsi/core/test_hostile_numbers.py checks every one is bounded): wide
# enough for any real run, narrow enough that a typo fails when the YAML is read, not hours into training.
MAX_EPOCHS = 100_000
MAX_BOOTSTRAP = 100_000  # resamples: 1000 give two-digit intervals; 10^5 already take minutes per figure
Epochs = Annotated[int, Field(ge=1, le=MAX_EPOCHS)]
_Rate = Annotated[float, Field(ge=0, lt=1)]  # a dropout probability
_Share = Annotated[float, Field(gt=0, le=1)]  # a nonzero share of a bag
_Positive = Annotated[float, Field(gt=0, le=1e6)]
_Lr = Annotated[float, Field(gt=0, le=10)]
_Decay = Annotated[float, Field(ge=0, le=10)]
_EpochCount = Annotated[int, Field(ge=0, le=MAX_EPOCHS)]  # 0 allowed: no warm-up, never stop early
_Window = Annotated[int, Field(ge=1, le=1000)]
_Weight = Annotated[float, Field(ge=0, le=1e6)]
_Horizon = Annotated[float, Field(gt=0, le=1e9)]  # a time in the label table's unit
_Batch = Annotated[int, Field(ge=1, le=65_536)]
_Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
_Beta = Annotated[float, Field(ge=0, lt=1)]  # an Adam moment decay
_MinLr = Annotated[float, Field(ge=0, le=10)]  # a learning rate's floor (0 allowed)
_Milestone = Annotated[int, Field(ge=1, le=MAX_EPOCHS)]
_Workers = Annotated[int, Field(ge=0, le=256)]
_Resamples = Annotated[int, Field(ge=1, le=MAX_BOOTSTRAP)]

# A model override is a field of the preset's model config (`models.build_model` keyword): a width, a
# rate, a switch, a name, a patch size, attention options. The model's own config checks each one's
# type and range when it is built (naming the field); these bounds only keep a task's numbers finite.
#: a model override's number: far beyond any width (models.layers.transformer.MAX_MODEL_INT) or rate, and
#: exact as a float, so an int and a float past it are refused alike; an int is never read from a float
_MODEL_NUMBER = 1e15
_ModelInt = Annotated[int, Field(strict=True, ge=-_MODEL_NUMBER, le=_MODEL_NUMBER)]
_ModelFloat = Annotated[float, Field(ge=-_MODEL_NUMBER, le=_MODEL_NUMBER)]
# a list (patch_size) or mapping (attention_options): its parts are the model config's to check
ModelValue = bool | _ModelInt | _ModelFloat | str | list[Any] | dict[str, Any] | None
ModelOverrides = dict[str, ModelValue]

# Fields below whose default is None take their value from the task's `recipe` when training starts
# (`pipelines.train.recipe.RECIPES` holds the values; docs/training.md "Which training recipe" explains them);
# a value written in the YAML always wins. The run record (config.json) keeps the resolved values.


@config_model
@dataclass(frozen=True)
class ModelConfig:
    preset: str | None = None  # models.build_model preset (configs/models/<preset>.yaml or a path);
    # None: the recipe's (small-cohort: sized to the number of training cases; paper: vit-wsi)
    attention: str | None = None  # seqnorm | softmax | sima | gdla (transformers), gated | plain
    # (abmil); None: the preset's own; a preset without an attention setting (the baselines) ignores
    # the task's (pipelines.train.recipe)
    scoring: Literal["softmax", "sigmoid"] | None = None  # categorical: how outputs become class
    # probabilities: softmax across one output per class, or each output its own sigmoid (DSMIL's
    # authors: one output for two classes, the first class the all-zero negative). None: the preset's
    # (`scoring` of dsmil; softmax for every other model); the run record keeps the resolved value
    overrides: ModelOverrides = field(default_factory=dict)  # extra build_model kwargs (dim, depth...);
    # the recipes add theirs here unless the key is given. Keys the preset's model kind has no field
    # for are left out for that preset (so `subtyping: true` reaches CLAM only); the rest are checked
    # when the model is built (models.build_model_from_config)


@config_model
@dataclass(frozen=True)
class OptimizerConfig:
    name: Literal["adamw", "adam", "lookahead-radam"] | None = None  # adamw (decoupled weight decay),
    # adam (torch's Adam: weight decay added to the gradient, as CLAM, DSMIL and DTFD-MIL train),
    # lookahead-radam (RAdam in Lookahead, k 6, alpha 0.5: TransMIL's); None: the recipe's
    lr: _Lr | None = None  # peak learning rate; None: the recipe's
    betas: tuple[_Beta, _Beta] | None = None  # Adam's moment decays; None: (0.9, 0.999)
    weight_decay: _Decay | None = None  # weight decay; None: the recipe's
    weight_decay_on: Literal["matrices", "all", "not-1d"] | None = None  # which parameters decay:
    # matrices (models.base.param_groups: never norms, biases, the class token), all (torch's default), not-1d
    # (timm's add_weight_decay: every parameter but biases and 1-d ones); None: the recipe's
    schedule: Literal["none", "cosine", "cosine-epochs", "multistep"] | None = None  # cosine: per-step
    # decay to 0 over max `epochs` after the warm-up; cosine-epochs: CosineAnnealingLR over `epochs`,
    # stepped per epoch, to min_lr; multistep: lr x gamma at each of `milestones` (epochs); None: the
    # recipe's
    min_lr: _MinLr | None = None  # cosine-epochs' floor; None: the recipe's (0)
    milestones: tuple[_Milestone, ...] | None = None  # multistep: epochs after which lr is multiplied
    gamma: Annotated[float, Field(gt=0, le=1)] | None = None  # multistep's factor; None: the recipe's
    warmup_epochs: _EpochCount | None = None  # linear warm-up of the learning rate from 0 over this many
    # epochs; None: the recipe's
    grad_clip: _Positive | None = None  # max gradient norm (a negative one trained backwards); None = off

    #: the learning-rate schedule's earlier name (`--scheduler` is a Dask address): old task files and
    #: run records still load
    OLD_NAMES: ClassVar[dict[str, str]] = {"scheduler": "schedule"}

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return new_names(cls, data)


@config_model
@dataclass(frozen=True)
class AugmentConfig:
    """Training-only changes to each feature bag (validation, test and prediction see whole bags)."""

    tile_fraction: tuple[_Share, _Share] | None = None  # keep a random share in [lo, hi] of each training
    # bag's tiles, drawn per bag and step (at least one tile); [1, 1] = whole bags; None: the recipe's
    feature_dropout: _Rate | None = None  # zero each input feature of a training tile with this chance
    # (inverted dropout); None: the recipe's


@config_model
@dataclass(frozen=True)
class SelectionConfig:
    """Which epoch's weights become best.safetensors, and what early stopping watches."""

    metric: Literal["val-figure", "smoothed-val-loss", "auroc-plus-accuracy"] | None = None  # val-figure:
    # the kind's figure (categorical: validation AUROC, ties by loss; survival: C-index);
    # smoothed-val-loss: the mean validation loss of the last `window` epochs (steadier than the AUROC
    # of a handful of bags); auroc-plus-accuracy (categorical): (the sum of each output's AUROC + the
    # accuracy at each output's Youden threshold) / 2, DSMIL's; None: the recipe's
    window: _Window | None = None  # epochs averaged by smoothed-val-loss and by average_weights; None: the
    # recipe's
    average_weights: bool | None = None  # best.safetensors holds the mean of the weights of the `window`
    # epochs ending at the chosen one (weight averaging over the epochs the smoothed loss averaged);
    # None: the recipe's
    after_share: Fraction | None = None  # only epochs after int(after_share * epochs) + 1 (and the last)
    # may become best.safetensors (DTFD-MIL's `ii > int(EPOCH * 0.8)`); None: the recipe's (0: any)


@config_model
@dataclass(frozen=True)
class SplitConfig:
    """Fractions of patients, stratified by class (survival: by event; regression: by tertile of the
    first target). Cross-validation holds out val/(train+val) of each fold's training patients for
    early stopping."""

    train: Fraction = 0.60  # fits the weights
    val: Fraction = 0.14  # picks the best epoch and stops early
    test: Fraction = 0.26  # scored once with the best weights; 0 = score on validation instead


@config_model
@dataclass(frozen=True)
class LabelColumns:
    slide: str = "slide"  # slide id or file name (a few common aliases are also found)
    label: str = "label"  # categorical: class name, one of the task's classes (other kinds: see targets)
    patient: str | None = "patient"  # optional; absent -> TCGA barcode's first 12 chars, else slide id


@config_model
@dataclass(frozen=True)
class TargetConfig:
    """One target of a regression or multi-target task: a column of the label table."""

    column: str  # label-table column holding it; also its name in outputs and figures
    type: Literal["categorical", "continuous"] = "continuous"  # regression tasks: continuous only
    classes: tuple[str, ...] = ()  # categorical targets: two or more names; their order fixes the outputs
    weight: _Weight = 1.0  # its share of the summed loss (multi-target); 0 = reported, not learned


@config_model
@dataclass(frozen=True)
class RegressionConfig:
    """How continuous targets (regression and multi-target tasks) are learned."""

    loss: Literal["mse", "huber"] = "mse"  # huber: less pulled by a few extreme labels
    huber_delta: _Positive = 1.0  # Huber's switch from squared to absolute (in standardised units if on)
    standardize: bool = True  # learn z-scores of the training split's values; predictions in label units


@config_model
@dataclass(frozen=True)
class SurvivalConfig:
    """Time-to-event columns and the Cox loss's settings."""

    time: str = "time"  # column: follow-up time (> 0, any unit: months, days)
    event: str = "event"  # column: 1 = event (death, progression) seen, 0 = censored (true/false, yes/no too)
    ties: Literal["efron", "breslow"] = "efron"  # tied event times: Efron is closer to exact, Breslow older
    # bags whose risks form one Cox loss: a loss over one bag compares nothing
    bags_per_step: Annotated[int, Field(ge=2, le=65_536)] = 16
    time_unit: str = "months"  # axis labels only
    auc_times: tuple[_Horizon, ...] = ()  # time-dependent AUC horizons; () = quartiles of the event times


@config_model
@dataclass(frozen=True)
class TaskConfig:
    name: str  # shown in logs and figure titles; defaults to the YAML file's stem
    classes: tuple[str, ...] = ()  # categorical: two or more distinct names; their order fixes the outputs
    kind: Literal["categorical", "regression", "survival", "multi-target"] = "categorical"  # what is learned
    level: Literal["slide", "patient"] = "slide"  # patient: every slide of a patient is one bag
    targets: tuple[TargetConfig, ...] = ()  # regression / multi-target: the label columns learned
    regression: RegressionConfig | None = None  # continuous targets' loss; None = the defaults
    survival: SurvivalConfig | None = None  # survival: columns and Cox settings; None = the defaults
    description: str = ""  # free text for the reader
    input: str = "bags"  # pipelines.inputs registry: bags | images
    input_options: JsonObject = field(default_factory=dict)  # the input adapter's keywords (it checks them)
    columns: LabelColumns = field(default_factory=LabelColumns)  # label table column names
    standardize_features: bool = False  # z-score every input feature with the mean and sd of the
    # training split's tiles (each fold its own), stored with the model and applied identically in
    # validation, test and `wsi predict`; features with sd ~0 are left unscaled (ours)
    recipe: Recipe = "small-cohort"  # what the fields left None below default to: small-cohort (any
    # cohort below a few hundred cases; regularised, sized to the data), paper (whole bags, the
    # preset as named, best epoch by the validation figure) or authors (a baseline preset's authors'
    # own: configs/recipes/<preset>.yaml); see docs/training.md "Which training recipe"
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    epochs: Epochs | None = None  # upper bound; early stopping usually ends sooner; None: the recipe's
    patience: _EpochCount | None = None  # epochs without a better selection score (`selection.metric`) before
    # stopping; 0 = never stop early; None: the recipe's
    min_epochs: _EpochCount | None = None  # early stopping never ends a run before this many epochs
    # (CLAM's stop_epoch); None: the recipe's (0)
    batch_size: _Batch = 1  # bags per step (padded + masked when > 1)
    grad_accum: _Batch | None = None  # optimizer step every this many batches; None: the recipe's (1)
    sampling: Literal["shuffle", "balanced"] | None = None  # training bags per epoch: each once in a
    # random order, or (categorical) drawn with replacement, each class equally often (CLAM's
    # --weighted_sample); None: the recipe's
    class_weighting: Literal["none", "balanced"] = "none"  # categorical: loss weights inverse to frequency
    seed: _Seed = 1337  # seeds weights, splits, shuffling and augmentation: same seed, same run
    num_workers: _Workers = 0  # DataLoader worker processes (0: read in the training process)
    bootstrap: _Resamples = 1000  # bootstrap resamples for every 95% interval of the test figures

    def replace(self, **changes: Any) -> TaskConfig:
        """A copy with dotted-key changes, e.g. {"model.attention": "sima", "epochs": 5}: each value checked
        against its field's type, then the rules between fields (`check_task`)."""
        source = f"{self.name} (with overrides)"
        return check_task(replace_config(self, changes, source=source), source)


    @property
    def regression_options(self) -> RegressionConfig:
        return self.regression or RegressionConfig()

    @property
    def survival_options(self) -> SurvivalConfig:
        return self.survival or SurvivalConfig()


def _distinct(names: tuple[str, ...]) -> bool:
    return len(names) >= 2 and len(set(names)) == len(names)


def _check_kind(task: TaskConfig, source: str) -> None:
    """The fields each kind needs, and none it would silently ignore."""
    kind, targets = task.kind, task.targets
    if kind == "categorical":
        if not _distinct(task.classes):
            got = list(task.classes)
            raise ConfigError(f"{source}: classes must be two or more distinct names, got {got}")
    elif task.classes:
        raise ConfigError(
            f"{source}: `classes` is for categorical tasks; a {kind} task "
            + ("gives categorical targets their own classes" if kind == "multi-target" else "has none")
        )
    if kind in ("regression", "multi-target"):
        if not targets:
            raise ConfigError(f"{source}: a {kind} task needs `targets` (a list of label-table columns)")
        columns = [t.column for t in targets]
        if len(set(columns)) != len(columns):
            raise ConfigError(f"{source}: targets name a column twice: {columns}")
    elif targets:
        raise ConfigError(f"{source}: `targets` is for regression and multi-target tasks, not {kind}")
    for t in targets:
        if kind == "regression" and t.type != "continuous":
            raise ConfigError(
                f"{source}: regression target {t.column!r} must be continuous; use kind: multi-target"
            )
        if t.type == "categorical" and not _distinct(t.classes):
            raise ConfigError(
                f"{source}: categorical target {t.column!r} needs two or more distinct classes, "
                f"got {list(t.classes)}"
            )
        if t.type == "continuous" and t.classes:
            raise ConfigError(f"{source}: continuous target {t.column!r} has classes; drop them")
    if targets and not any(t.weight > 0 for t in targets):
        raise ConfigError(f"{source}: every target has loss weight 0; nothing would be learned")
    if task.survival is not None and kind != "survival":
        raise ConfigError(f"{source}: `survival` options are for survival tasks, not {kind}")
    if task.regression is not None and not any(t.type == "continuous" for t in targets):
        raise ConfigError(f"{source}: `regression` options need a continuous target")
    surv = task.survival_options
    if surv.time == surv.event:
        raise ConfigError(f"{source}: survival needs distinct time and event columns, not {surv.time!r}")
    if task.class_weighting != "none" and kind != "categorical":
        raise ConfigError(f"{source}: class_weighting is for categorical tasks, not {kind}")
    categorical_only = {
        "sampling: balanced": task.sampling == "balanced",
        "model.scoring: sigmoid": task.model.scoring == "sigmoid",
        "selection.metric: auroc-plus-accuracy": task.selection.metric == "auroc-plus-accuracy",
    }
    for what, given in categorical_only.items():
        if given and kind != "categorical":
            raise ConfigError(f"{source}: {what} is for categorical tasks (one class per case), not {kind}")
    if task.level == "patient" and task.input not in ("bags", "slide-embeddings"):
        raise ConfigError(
            f"{source}: level: patient joins a patient's slides into one bag; it needs input: bags "
            "(or slide-embeddings, whose slides are averaged)"
        )


def check_task(task: TaskConfig, source: str) -> TaskConfig:
    """The rules between fields that types cannot say; returns `task` unchanged when they hold."""
    _check_kind(task, source)
    s = task.split
    if (
        min(s.train, s.val, s.test) < 0
        or s.train <= 0
        or s.val <= 0
        or abs(s.train + s.val + s.test - 1) > 1e-6
    ):
        raise ConfigError(f"{source}: split fractions must be >= 0 (train, val > 0) and sum to 1, got {s}")
    if task.standardize_features and task.input == "images":
        raise ConfigError(
            f"{source}: standardize_features z-scores the features of bags or slide embeddings, not "
            "images (their transforms normalise pixels); set it false"
        )
    _check_recipe_fields(task, source)
    return task


def _check_recipe_fields(task: TaskConfig, source: str) -> None:
    """What the fields a recipe fills need besides their ranges (checked when given; the recipes' own
    values hold them). Each number's range is its field's type (checked when parsed)."""
    aug = task.augment
    if aug.tile_fraction is not None:
        lo, hi = aug.tile_fraction
        if not 0 < lo <= hi <= 1:
            raise ConfigError(
                f"{source}: augment.tile_fraction must be [lo, hi] with 0 < lo <= hi <= 1, got {[lo, hi]}"
            )


def parse_task(data: Mapping[str, object], *, source: str) -> TaskConfig:
    """A mapping (YAML, a run record) as a checked `TaskConfig`; errors name `source` and the field."""
    return check_task(parse_config(TaskConfig, data, source=source), source)


def load_task(name_or_path: str | Path) -> TaskConfig:
    """A packaged task by name (`nsclc-subtype`) or a user's YAML file by path or URL (its local copy;
    a URL with credentials is refused without being shown)."""
    from wsi.storage import is_url, local_file

    if is_url(str(name_or_path)):
        name_or_path = local_file(str(name_or_path), what="task file")
    data, source = load_yaml("tasks", name_or_path)
    data.setdefault("name", Path(str(name_or_path)).stem)
    return parse_task(data, source=source)


__all__ = [
    "AugmentConfig",
    "LabelColumns",
    "ModelConfig",
    "ModelOverrides",
    "ModelValue",
    "OptimizerConfig",
    "Recipe",
    "RegressionConfig",
    "SelectionConfig",
    "SplitConfig",
    "SurvivalConfig",
    "TargetConfig",
    "TaskConfig",
    "check_task",
    "load_task",
    "parse_task",
]

"""Task configs: a YAML per task (packaged in configs/tasks/ or any path), typed and validated.

A task says what is learned (its `kind`, classes or targets, label columns), at which `level` (one bag
per slide or per patient), from which input, with which model and how it is trained. Kinds:

  categorical   one class per case (`classes`, the label column); the default
  regression    one or more continuous `targets` (MSE or Huber loss, optionally standardised)
  survival      time-to-event (`survival.time`, `survival.event` columns), Cox partial likelihood
  multi-target  several categorical and/or continuous `targets`, one slice of the outputs each

The model is the same for every kind; only the number of its outputs, the loss, the batching and the
figures change (`pipelines.kinds`). Training follows it; prediction reads it back from the run record
(`pipelines.run_record`), which is why it lives beside both and not inside `pipelines.train`.

Types and unknown keys are checked by `wsi.config.parse_config` (the one validator); the rules that tie
fields together (split fractions summing to 1, at least two classes) are `check_task`'s. The resolved
task is saved with every run, so a run can be repeated and checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from wsi.config import config_model, parse_config, replace_config
from wsi.configs import load_yaml
from wsi.errors import ConfigError

Recipe = Literal["small-cohort", "paper"]

# Fields below whose default is None take their value from the task's `recipe` when training starts
# (`pipelines.train.recipe.RECIPES` holds the values; README.md "Which training recipe" explains them);
# a value written in the YAML always wins. The run record (config.json) keeps the resolved values.


@config_model
@dataclass(frozen=True)
class ModelConfig:
    preset: str | None = None  # models.build_model preset (configs/models/<preset>.yaml or a path);
    # None: the recipe's (small-cohort: sized to the number of training cases; paper: vit-wsi)
    attention: str | None = None  # seqnorm | softmax | sima | gdla (transformers), gated | plain
    # (abmil); None: the preset's own
    overrides: dict[str, Any] = field(default_factory=dict)  # extra build_model kwargs (dim, depth...);
    # the small-cohort recipe adds its dropout here unless the key is given


@config_model
@dataclass(frozen=True)
class OptimizerConfig:
    name: Literal["adamw"] = "adamw"  # the only optimizer: what the reference recipes use
    lr: float | None = None  # peak learning rate; None: the recipe's
    weight_decay: float | None = None  # AdamW's decoupled weight decay, on weight matrices only
    # (models.param_groups: never on norms, biases, the class token); None: the recipe's
    scheduler: Literal["none", "cosine"] | None = None  # cosine: per-step decay to 0 over max `epochs`
    # after the warm-up; None: the recipe's
    warmup_epochs: int | None = None  # linear warm-up of the learning rate from 0 over this many epochs;
    # None: the recipe's
    grad_clip: float | None = None  # max gradient norm; None = off


@config_model
@dataclass(frozen=True)
class AugmentConfig:
    """Training-only changes to each feature bag (validation, test and prediction see whole bags)."""

    tile_fraction: tuple[float, float] | None = None  # keep a random share in [lo, hi] of each training
    # bag's tiles, drawn per bag and step (at least one tile); [1, 1] = whole bags; None: the recipe's
    feature_dropout: float | None = None  # zero each input feature of a training tile with this chance
    # (inverted dropout); None: the recipe's


@config_model
@dataclass(frozen=True)
class SelectionConfig:
    """Which epoch's weights become best.safetensors, and what early stopping watches."""

    metric: Literal["val-figure", "smoothed-val-loss"] | None = None  # val-figure: the kind's figure
    # (categorical: validation AUROC, ties by loss; survival: C-index); smoothed-val-loss: the mean
    # validation loss of the last `window` epochs (steadier than the AUROC of a handful of bags);
    # None: the recipe's
    window: int | None = None  # epochs averaged by smoothed-val-loss and by average_weights; None: the
    # recipe's
    average_weights: bool | None = None  # best.safetensors holds the mean of the weights of the `window`
    # epochs ending at the chosen one (weight averaging over the epochs the smoothed loss averaged);
    # None: the recipe's


@config_model
@dataclass(frozen=True)
class SplitConfig:
    """Fractions of patients, stratified by class (survival: by event; regression: by tertile of the
    first target). Cross-validation holds out val/(train+val) of each fold's training patients for
    early stopping."""

    train: float = 0.60  # fits the weights
    val: float = 0.14  # picks the best epoch and stops early
    test: float = 0.26  # scored once with the best weights; 0 = score on validation instead


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
    weight: float = 1.0  # its share of the summed loss (multi-target); 0 = reported, not learned


@config_model
@dataclass(frozen=True)
class RegressionConfig:
    """How continuous targets (regression and multi-target tasks) are learned."""

    loss: Literal["mse", "huber"] = "mse"  # huber: less pulled by a few extreme labels
    huber_delta: float = 1.0  # Huber's switch from squared to absolute (in standardised units if on)
    standardize: bool = True  # learn z-scores of the training split's values; predictions in label units


@config_model
@dataclass(frozen=True)
class SurvivalConfig:
    """Time-to-event columns and the Cox loss's settings."""

    time: str = "time"  # column: follow-up time (> 0, any unit: months, days)
    event: str = "event"  # column: 1 = event (death, progression) seen, 0 = censored (true/false, yes/no too)
    ties: Literal["efron", "breslow"] = "efron"  # tied event times: Efron is closer to exact, Breslow older
    bags_per_step: int = 16  # bags whose risks form one Cox loss: a loss over one bag compares nothing
    time_unit: str = "months"  # axis labels only
    auc_times: tuple[float, ...] = ()  # time-dependent AUC horizons; () = quartiles of the event times


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
    input_options: dict[str, Any] = field(default_factory=dict)  # validated by the input adapter
    columns: LabelColumns = field(default_factory=LabelColumns)  # label table column names
    standardize_features: bool = False  # z-score every input feature with the mean and sd of the
    # training split's tiles (each fold its own), stored with the model and applied identically in
    # validation, test and `wsi predict`; features with sd ~0 are left unscaled (ours)
    recipe: Recipe = "small-cohort"  # what the fields left None below default to: small-cohort (any
    # cohort below a few hundred cases; regularised, sized to the data) or paper (whole bags, the
    # preset as named, best epoch by the validation figure); see README.md "Which training recipe"
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    epochs: int | None = None  # upper bound; early stopping usually ends sooner; None: the recipe's
    patience: int | None = None  # epochs without a better selection score (`selection.metric`) before
    # stopping; 0 = never stop early; None: the recipe's
    batch_size: int = 1  # bags per step (padded + masked when > 1)
    grad_accum: int = 1  # optimizer step every this many batches
    class_weighting: Literal["none", "balanced"] = "none"  # categorical: loss weights inverse to frequency
    seed: int = 1337  # seeds weights, splits, shuffling and augmentation: same seed, same run
    num_workers: int = 0  # DataLoader worker processes (0: read in the training process)
    bootstrap: int = 1000  # bootstrap resamples for every 95% interval of the test figures

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
        if t.weight < 0:
            raise ConfigError(f"{source}: target {t.column!r} has a negative loss weight {t.weight}")
    if targets and not any(t.weight > 0 for t in targets):
        raise ConfigError(f"{source}: every target has loss weight 0; nothing would be learned")
    if task.survival is not None and kind != "survival":
        raise ConfigError(f"{source}: `survival` options are for survival tasks, not {kind}")
    if task.regression is not None and not any(t.type == "continuous" for t in targets):
        raise ConfigError(f"{source}: `regression` options need a continuous target")
    surv = task.survival_options
    if surv.bags_per_step < 2 or surv.time == surv.event:
        raise ConfigError(
            f"{source}: survival needs bags_per_step >= 2 (a Cox loss compares bags) and distinct "
            f"time and event columns, got {surv.bags_per_step}, {surv.time!r}, {surv.event!r}"
        )
    if any(t <= 0 for t in surv.auc_times) or task.regression_options.huber_delta <= 0:
        raise ConfigError(f"{source}: survival.auc_times and regression.huber_delta must be positive")
    if task.class_weighting != "none" and kind != "categorical":
        raise ConfigError(f"{source}: class_weighting is for categorical tasks, not {kind}")
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
    for name in ("epochs", "batch_size", "grad_accum", "bootstrap"):
        value = getattr(task, name)
        if value is not None and value < 1:
            raise ConfigError(f"{source}: {name} must be at least 1, got {value}")
    if (task.patience or 0) < 0 or task.num_workers < 0:
        raise ConfigError(f"{source}: patience and num_workers must be >= 0")
    if task.standardize_features and task.input == "images":
        raise ConfigError(
            f"{source}: standardize_features z-scores the features of bags or slide embeddings, not "
            "images (their transforms normalise pixels); set it false"
        )
    _check_recipe_fields(task, source)
    return task


def _check_recipe_fields(task: TaskConfig, source: str) -> None:
    """Ranges of the fields a recipe fills (checked when given; the recipes' own values hold them)."""
    opt, aug, sel = task.optimizer, task.augment, task.selection
    if opt.lr is not None and opt.lr <= 0:
        raise ConfigError(f"{source}: optimizer.lr must be positive, got {opt.lr}")
    if (opt.weight_decay or 0) < 0 or (opt.warmup_epochs or 0) < 0:
        raise ConfigError(f"{source}: optimizer.weight_decay and optimizer.warmup_epochs must be >= 0")
    if aug.tile_fraction is not None:
        lo, hi = aug.tile_fraction
        if not 0 < lo <= hi <= 1:
            raise ConfigError(
                f"{source}: augment.tile_fraction must be [lo, hi] with 0 < lo <= hi <= 1, got {[lo, hi]}"
            )
    if not 0 <= (aug.feature_dropout or 0) < 1:
        raise ConfigError(f"{source}: augment.feature_dropout must be in [0, 1), got {aug.feature_dropout}")
    if sel.window is not None and sel.window < 1:
        raise ConfigError(f"{source}: selection.window must be at least 1, got {sel.window}")


def parse_task(data: dict[str, Any], *, source: str) -> TaskConfig:
    """A mapping (YAML, a run record) as a checked `TaskConfig`; errors name `source` and the field."""
    return check_task(parse_config(TaskConfig, data, source=source), source)


def load_task(name_or_path: str | Path) -> TaskConfig:
    """A packaged task by name (`nsclc-subtype`) or a user's YAML file by path."""
    data, source = load_yaml("tasks", name_or_path)
    data.setdefault("name", Path(str(name_or_path)).stem)
    return parse_task(data, source=source)


__all__ = [
    "AugmentConfig",
    "LabelColumns",
    "ModelConfig",
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

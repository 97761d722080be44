"""Task configs: a YAML per task (packaged in configs/tasks/ or any path), typed and validated.

A task says what is learned (classes, label columns), from which input, with which model and how it is
trained. Training follows it; prediction reads it back from the run record (`pipelines.run_record`),
which is why it lives beside both and not inside `pipelines.train`.

Types and unknown keys are checked by `wsi.config.parse_config` (the one validator); the rules that tie
fields together (split fractions summing to 1, at least two classes) are `check_task`'s. The resolved
task is saved with every run, so a run can be repeated and checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from configs import load_yaml
from wsi.config import config_dict, config_model, parse_config
from wsi.errors import ConfigError


@config_model
@dataclass(frozen=True)
class ModelConfig:
    preset: str = "vit-wsi"  # models.build_model preset (configs/models/<preset>.yaml or a path)
    attention: str = "seqnorm"  # seqnorm | softmax | sima | gdla (models.build_attention registry)
    overrides: dict[str, Any] = field(default_factory=dict)  # extra build_model kwargs (dim, depth...)


@config_model
@dataclass(frozen=True)
class OptimizerConfig:
    name: Literal["adamw"] = "adamw"  # the only optimizer: what the reference recipes use
    lr: float = 1e-4  # peak learning rate
    weight_decay: float = 1e-2  # AdamW's decoupled weight decay
    scheduler: Literal["none", "cosine"] = "none"  # cosine: per-step decay to 0 over max `epochs`
    grad_clip: float | None = None  # max gradient norm; None = off


@config_model
@dataclass(frozen=True)
class SplitConfig:
    """Fractions of patients, stratified by class. Cross-validation holds out val/(train+val) of each
    fold's training patients for early stopping."""

    train: float = 0.60  # fits the weights
    val: float = 0.14  # picks the best epoch and stops early
    test: float = 0.26  # scored once with the best weights; 0 = score on validation instead


@config_model
@dataclass(frozen=True)
class LabelColumns:
    slide: str = "slide"  # slide id or file name (a few common aliases are also found)
    label: str = "label"  # class name, one of the task's classes
    patient: str | None = "patient"  # optional; absent -> TCGA barcode's first 12 chars, else slide id


@config_model
@dataclass(frozen=True)
class TaskConfig:
    name: str  # shown in logs and figure titles; defaults to the YAML file's stem
    classes: tuple[str, ...]  # two or more distinct names; the order fixes the model's outputs
    description: str = ""  # free text for the reader
    input: str = "bags"  # pipelines.inputs registry: bags | images
    input_options: dict[str, Any] = field(default_factory=dict)  # validated by the input adapter
    columns: LabelColumns = field(default_factory=LabelColumns)  # label table column names
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    epochs: int = 100  # upper bound; early stopping usually ends sooner
    patience: int = 10  # epochs without a better validation AUROC before stopping; 0 = never stop early
    batch_size: int = 1  # bags per step (padded + masked when > 1)
    grad_accum: int = 1  # optimizer step every this many batches
    class_weighting: Literal["none", "balanced"] = "none"  # loss weights inverse to class frequency
    seed: int = 1337  # seeds weights, splits, shuffling and augmentation: same seed, same run
    num_workers: int = 0  # DataLoader worker processes (0: read in the training process)
    bootstrap: int = 1000  # bootstrap resamples for the test AUROC interval

    def replace(self, **changes: Any) -> TaskConfig:
        """A copy with dotted-key changes, e.g. {"model.attention": "sima", "epochs": 5}, re-validated."""
        data = config_dict(self)
        for key, value in changes.items():
            node = data
            *parents, last = key.split(".")
            for part in parents:
                if not isinstance(node.get(part), dict):
                    raise ConfigError(f"{self.name}: cannot set {key!r}: {part!r} is not a group of fields")
                node = node[part]
            node[last] = value
        return parse_task(data, source=f"{self.name} (with overrides)")


def check_task(task: TaskConfig, source: str) -> TaskConfig:
    """The rules between fields that types cannot say; returns `task` unchanged when they hold."""
    if len(task.classes) < 2 or len(set(task.classes)) != len(task.classes):
        raise ConfigError(f"{source}: classes must be two or more distinct names, got {list(task.classes)}")
    s = task.split
    if (
        min(s.train, s.val, s.test) < 0
        or s.train <= 0
        or s.val <= 0
        or abs(s.train + s.val + s.test - 1) > 1e-6
    ):
        raise ConfigError(f"{source}: split fractions must be >= 0 (train, val > 0) and sum to 1, got {s}")
    for name in ("epochs", "batch_size", "grad_accum", "bootstrap"):
        if getattr(task, name) < 1:
            raise ConfigError(f"{source}: {name} must be at least 1, got {getattr(task, name)}")
    if task.patience < 0 or task.num_workers < 0:
        raise ConfigError(f"{source}: patience and num_workers must be >= 0")
    if task.optimizer.lr <= 0:
        raise ConfigError(f"{source}: optimizer.lr must be positive, got {task.optimizer.lr}")
    return task


def parse_task(data: dict[str, Any], *, source: str) -> TaskConfig:
    """A mapping (YAML, a run record) as a checked `TaskConfig`; errors name `source` and the field."""
    return check_task(parse_config(TaskConfig, data, source=source), source)


def load_task(name_or_path: str | Path) -> TaskConfig:
    """A packaged task by name (`nsclc-subtype`) or a user's YAML file by path."""
    data, source = load_yaml("tasks", name_or_path)
    data.setdefault("name", Path(str(name_or_path)).stem)
    return parse_task(data, source=source)


__all__ = [
    "LabelColumns",
    "ModelConfig",
    "OptimizerConfig",
    "SplitConfig",
    "TaskConfig",
    "check_task",
    "load_task",
    "parse_task",
]

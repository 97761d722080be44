"""Task configs: a YAML per task (packaged in configs/tasks/ or any path), typed and validated.

Every field is documented here; unknown keys are rejected (a typo must not silently fall back to a
default). The resolved config is saved with every run, so a run can be repeated and checked.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from configs import load_yaml
from wsi.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    preset: str = "vit-wsi"  # models.build_model preset
    attention: str = "seqnorm"  # seqnorm | softmax | sima | gdla (models.build_attention registry)
    overrides: dict[str, Any] = field(default_factory=dict)  # extra build_model kwargs (dim, depth...)


@dataclass(frozen=True)
class OptimizerConfig:
    name: Literal["adamw"] = "adamw"
    lr: float = 1e-4
    weight_decay: float = 1e-2
    scheduler: Literal["none", "cosine"] = "none"  # cosine: per-step decay to 0 over max `epochs`
    grad_clip: float | None = None  # max gradient norm; None = off


@dataclass(frozen=True)
class SplitConfig:
    """Fractions of patients, stratified by class. Cross-validation holds out val/(train+val) of each
    fold's training patients for early stopping."""

    train: float = 0.60
    val: float = 0.14
    test: float = 0.26


@dataclass(frozen=True)
class LabelColumns:
    slide: str = "slide"  # slide id or file name (a few common aliases are also found)
    label: str = "label"
    patient: str | None = "patient"  # optional; absent -> TCGA barcode's first 12 chars, else slide id


@dataclass(frozen=True)
class TaskConfig:
    name: str
    classes: tuple[str, ...]
    description: str = ""
    input: str = "bags"  # pipelines.inputs registry: bags | images
    input_options: dict[str, Any] = field(default_factory=dict)  # validated by the input stage
    columns: LabelColumns = field(default_factory=LabelColumns)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    epochs: int = 100  # upper bound; early stopping usually ends sooner
    patience: int = 10  # epochs without a better validation AUROC before stopping; 0 = never stop early
    batch_size: int = 1  # bags per step (padded + masked when > 1)
    grad_accum: int = 1  # optimizer step every this many batches
    class_weighting: Literal["none", "balanced"] = "none"  # loss weights inverse to class frequency
    seed: int = 1337
    num_workers: int = 0  # DataLoader worker processes
    bootstrap: int = 1000  # bootstrap resamples for the test AUROC interval

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TaskConfig:
        """A copy with dotted-key changes, e.g. {"model.attention": "sima", "epochs": 5}, re-validated."""
        data = self.to_dict()
        for key, value in changes.items():
            node = data
            *parents, last = key.split(".")
            for part in parents:
                node = node[part]
            node[last] = value
        return task_from_dict(data, source=f"{self.name} (with overrides)")


def _check_type(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _check_type(value, arg, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {value!r} is not a valid {tp}")
    if tp is type(None):
        if value is not None:
            raise ConfigError(f"{where}: expected null, got {value!r}")
        return None
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(str, typing.get_args(tp)))}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(_check_type(v, typing.get_args(tp)[0], f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return _from_dict(tp, value, where)
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is str and isinstance(value, str):
        return value
    if tp is bool and isinstance(value, bool):
        return value
    raise ConfigError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def _from_dict(cls: Any, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(fields)}")
    kwargs = {k: _check_type(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {', '.join(missing)}")
    return cls(**kwargs)


def task_from_dict(data: dict[str, Any], *, source: str) -> TaskConfig:
    task: TaskConfig = _from_dict(TaskConfig, data, source)
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


def load_task(name_or_path: str | Path) -> TaskConfig:
    """A packaged task by name (`nsclc-subtype`) or a user's YAML file by path."""
    data, source = load_yaml("tasks", name_or_path)
    data.setdefault("name", Path(str(name_or_path)).stem)
    return task_from_dict(data, source=source)

"""The settings of a training run: one typed config that `train()` takes and `wsi train` builds its
options from, so each default, range, choice list and help text is written once.

A setting left None keeps the task's own value (the task YAML, then its recipe); a value given here
changes the task before anything else reads it (`task_changes`), through the same checks a task YAML
meets. Library callers may also change any other task field by dotted key (`overrides`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from wsi.core.config import MAX_BAG_SIZE, MAX_MPP, bounds_of, config_model, setting
from wsi.core.errors import ConfigError
from wsi.pipelines.runs.record import RunRecord
from wsi.pipelines.scheduling.remote import Location
from wsi.pipelines.study.tasks import ModelOverrides, TaskConfig


def _attention_names() -> list[str]:
    from wsi.models.attention import ATTENTION

    return ATTENTION.names()


def _preset_help() -> str:
    from wsi.configs import available

    names = ", ".join(available("models"))
    return (f"Model preset ({names}) or a model YAML path; linear or mlp read slide embeddings; clam-sb, "
            "clam-mb, dsmil and dtfd train categorical tasks only.")


@config_model
@dataclass(frozen=True)
class TrainOptions:
    """How a task is trained on one cohort: where its inputs are, what of the task to change, where
    and how to run. The task says what is learned; the label table and run folder are `train`'s own
    arguments."""

    features_dir: Location = setting(
        None, existing="any",
        help="Folder of feature bags (wsi embed, STAMP, CLAM, TRIDENT) for `input: bags` tasks, or its URL.",
    )  # fmt: skip
    images_dir: Location = setting(
        None, existing="any", help="Folder of images for `input: images` tasks, or its URL."
    )
    preset: str | None = setting(
        None, help=_preset_help(),
        default_text="the task's; linear when --features holds slide embeddings",
    )  # fmt: skip
    attention: str | None = setting(
        None, choices=_attention_names, default_text="the task's", help="Attention variant."
    )
    recipe: Literal["small-cohort", "paper", "authors"] | None = setting(
        None, default_text="the task's",
        help="Training recipe: small-cohort, paper, or authors (a baseline preset's authors' own: "
        "configs/recipes/<preset>.yaml). Given here, its values replace the task's own training settings "
        "(optimizer, schedule, epochs, stopping, sampling); other options still win.",
    )  # fmt: skip
    device: str = setting("auto", help="Device: auto (CUDA, MPS, CPU), cpu, cuda, cuda:N, mps.")
    epochs: int | None = setting(
        None, **bounds_of(TaskConfig, "epochs"), default_text="the task's", help="Maximum epochs."
    )
    seed: int | None = setting(
        None, **bounds_of(TaskConfig, "seed"), default_text="the task's", help="Random seed."
    )
    batch_size: int | None = setting(
        None, **bounds_of(TaskConfig, "batch_size"), default_text="the task's", help="Bags per step."
    )
    grad_accum: int | None = setting(
        None, **bounds_of(TaskConfig, "grad_accum"), default_text="the task's",
        help="Batches per optimizer step.",
    )
    bag_size: int | None = setting(
        None, ge=1, le=MAX_BAG_SIZE, default_text="the task's input_options.bag_size (off)",
        help="Train on random subsets of at most this many tiles per bag (augmentation).",
    )  # fmt: skip
    num_workers: int | None = setting(
        None, **bounds_of(TaskConfig, "num_workers"), default_text="the task's",
        help="Background processes reading bags (GPU training: 2-8).",
    )  # fmt: skip
    standardize_features: bool | None = setting(
        None, default_text="the task's standardize_features",
        help="Z-score each input feature with the training split's tile mean and sd (stored with the "
        "model, applied in validation, test and predict).",
    )  # fmt: skip
    cv: int | None = setting(
        None, **bounds_of(RunRecord, "cv"), help="K-fold cross-validation (patient-grouped)."
    )
    scheduler: str | None = setting(
        None, help="Run the --cv folds in parallel on a dask.distributed cluster (e.g. tcp://host:8786)."
    )
    resume: bool = setting(False, help="Continue an interrupted run in --out from its last epoch.")
    init_from: Location = setting(
        None, existing="any",
        help="Start from a run folder or .safetensors (softmax weights are transferred to --attention).",
    )  # fmt: skip
    allow_unfinished: bool = setting(
        False,
        help="Start --init-from a run whose training is still running or did not finish (its current best "
        "checkpoint); refused without it.",
    )
    mpp: float | None = setting(
        None, gt=0, le=MAX_MPP,
        help="Level-0 um/px of the slides behind bags that store pixel coordinates (CLAM, TRIDENT); needed "
        "only when the model uses tile positions. An `mpp` column in --labels wins per slide.",
    )  # fmt: skip
    progress: bool = setting(True, help="Progress bars (--no-progress: none).")
    model_overrides: ModelOverrides = field(default_factory=dict)  # models.build_model arguments
    # ({"dim": 32, "depth": 1}), merged over the task's model.overrides
    overrides: dict[str, Any] = field(default_factory=dict)  # any other task field by dotted key
    # ({"optimizer.lr": 3e-4}); the fields above win over the same key here

    def __post_init__(self) -> None:
        if self.attention is not None and self.attention not in _attention_names():
            raise ConfigError(
                f"unknown attention {self.attention!r}; choose one of {', '.join(_attention_names())}"
            )
        if self.scheduler and not self.cv:
            raise ConfigError("--scheduler runs cross-validation folds in parallel; give --cv K too")

    def task_changes(self, task_overrides: Mapping[str, Any]) -> dict[str, Any]:
        """The dotted task changes these settings make (`TaskConfig.replace`); `task_overrides` is the
        task's own model.overrides, which `model_overrides` are merged over."""
        changes: dict[str, Any] = {}
        if self.recipe is not None:  # the recipe's values, not the task's: reset what it fills
            from wsi.pipelines.train.recipe import RECIPE_FIELDS

            changes = {"recipe": self.recipe, **dict.fromkeys(RECIPE_FIELDS)}
        changes.update(self.overrides)
        for key, value in (
            ("model.preset", self.preset), ("model.attention", self.attention), ("epochs", self.epochs),
            ("seed", self.seed), ("batch_size", self.batch_size), ("grad_accum", self.grad_accum),
            ("input_options.bag_size", self.bag_size), ("num_workers", self.num_workers),
            ("standardize_features", self.standardize_features),
        ):  # fmt: skip
            if value is not None:
                changes[key] = value
        if self.model_overrides:
            changes["model.overrides"] = {**task_overrides, **self.model_overrides}
        return changes

    def given_model_settings(self) -> dict[str, Any]:
        """The model settings these options give, named as given (refused when the preset cannot
        take them: pipelines.train.model_settings)."""
        from wsi.pipelines.train.model_settings import given_model_settings

        return given_model_settings(self.attention, self.model_overrides)


__all__ = ["TrainOptions"]

"""One fold: a split trained into one folder from the run's start state, then scored.

`StartState` is built once per run: the model as initialised right after seeding, and the random
generators right after building it. Every fold (the only one of a plain run, each of K for
cross-validation, on this process or a dask worker) trains a copy of that model from that random
state, so folds are reproducible wherever they run and no model is built just to be thrown away.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from wsi.core.errors import ConfigError, WeightsError
from wsi.models.layers.standardize import STANDARDIZER, attach_standardizer
from wsi.pipelines.inputs import InputAdapter
from wsi.pipelines.runs.checkpoints import load_state_into, load_weights
from wsi.pipelines.runs.record import ModelArchitecture, read_run_record, record_path, write_fitted
from wsi.pipelines.scheduling.devices import resolve_device
from wsi.pipelines.study.kinds import build_kind
from wsi.pipelines.study.tasks import TaskConfig
from wsi.pipelines.train.evaluate import evaluate_best
from wsi.pipelines.train.feature_stats import fit_feature_stats
from wsi.pipelines.train.loop import EpochHook, fit
from wsi.pipelines.train.results import RunMetrics
from wsi.pipelines.train.splits import Split
from wsi.pipelines.train.state import RngState, has_resume, seed_everything

log = logging.getLogger(__name__)


@dataclass
class StartState:
    """What every fold starts from: the initialised model and the random state right after building it."""

    model: torch.nn.Module  # never trained itself: each fold trains a copy
    seed: int  # the task's seed: CUDA generators stay as it seeded them (the model is built on the CPU)
    rng: RngState  # CPU-side generators right after the model was built

    @classmethod
    def build(cls, model_kwargs: Mapping[str, Any], *, seed: int) -> StartState:
        """Seed every generator, then build `models.build_model(**model_kwargs)`."""
        from wsi.models import build_model

        seed_everything(seed)
        kwargs = dict(model_kwargs)
        model = build_model(kwargs.pop("preset"), **kwargs)
        return cls(model=model, seed=seed, rng=RngState.capture(cuda=False))

    def begin(self) -> torch.nn.Module:
        """A copy of the initial model, with every random generator as right after building it."""
        seed_everything(self.seed)
        self.rng.restore()
        return copy.deepcopy(self.model)

    def architecture(self) -> ModelArchitecture:
        """The model's `config_dict()`: what the run record keeps and predict rebuilds."""
        config_dict = getattr(self.model, "config_dict", None)
        if not callable(config_dict):
            name = type(self.model).__name__
            raise ConfigError(f"{name} has no config_dict(); a run record needs the model's architecture")
        return ModelArchitecture(config_dict())


def model_kwargs(task: TaskConfig, num_outputs: int, adapter_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`models.build_model` arguments: the preset, attention, data-given sizes, then the overrides.
    `num_outputs` is the number of outputs the task's kind needs (classes, targets, one risk)."""
    return {
        "preset": task.model.preset,
        "attention": task.model.attention,
        "num_classes": num_outputs,
        **dict(adapter_kwargs),
        **task.model.overrides,  # settled for the preset (pipelines.train.model_settings)
    }


@dataclass(frozen=True)
class FoldSpec:
    """One split trained into one folder: all `run_fold` needs, picklable for dask workers."""

    task: TaskConfig
    adapter: InputAdapter
    split: Split
    run_dir: Path  # holds config.json and splits.csv already
    start: StartState
    device: str  # as given ("auto" is resolved by the process that trains)
    resume: bool  # continue from run_dir/resume/ when it is there
    init_from: Path | None  # a run folder or .safetensors to start from (not when resuming)
    progress: bool  # progress bars
    on_epoch_end: EpochHook | None = None  # called with each epoch's log row (not on dask workers)
    fold: str = ""  # "fold k/K" in a cross-validation (its log lines start with it), "" for a plain run


def run_fold(spec: FoldSpec) -> RunMetrics:
    """Train one split into one folder and score its best weights; returns what metrics.json holds."""
    device = resolve_device(spec.device)
    if spec.fold:
        parts = spec.split
        log.info(
            "%s: training on %d cases (validation %d, test %d) into %s",
            spec.fold, len(parts.train), len(parts.val), len(parts.test), spec.run_dir,
        )  # fmt: skip
    model = spec.start.begin()
    if spec.init_from is not None and not has_resume(spec.run_dir):
        init_from(model, spec.init_from, spec.task.model.attention, task=spec.task)
    kind = build_kind(spec.task)
    kind.fit(spec.split.train, device)  # class weights, standardisation: from this fold's training cases
    if spec.task.standardize_features:  # the input's z-scores: this fold's training tiles, into the model
        stats = fit_feature_stats(spec.adapter, spec.split.train, num_workers=spec.task.num_workers)
        attach_standardizer(model, *stats.tensors())
    if kind.fitted():
        write_fitted(spec.run_dir, kind.fitted())
    state = fit(
        task=spec.task, kind=kind, adapter=spec.adapter, split=spec.split, model=model,
        run_dir=spec.run_dir, device=device, resume=spec.resume, progress=spec.progress,
        on_epoch_end=spec.on_epoch_end,
    )  # fmt: skip
    return RunMetrics.from_json(evaluate_best(
        task=spec.task, kind=kind, adapter=spec.adapter, split=spec.split, model=model,
        run_dir=spec.run_dir, device=device, state=state, label=spec.fold,
    ))  # fmt: skip


def init_from(
    model: torch.nn.Module, source: Path, attention: str | None, *, task: TaskConfig | None = None
) -> None:
    """Start from another run's weights: same attention -> load; softmax -> transfer to softmax-free.
    Given this run's `task`, a run of another kind (or, categorical, other classes) is refused by name
    before any weight is loaded; tensors of other shapes are named by `load_state_into`."""
    from wsi.models.presets import transfer_softmax_to_seqnorm

    source = Path(source)
    ckpt = source / "best.safetensors" if source.is_dir() else source
    src_attention = None
    if record_path(ckpt.parent).is_file():
        src_task = read_run_record(ckpt.parent).task
        src_attention = src_task.model.attention
        if task is not None:
            _check_same_task(source, src_task, task)
    state = load_weights(ckpt)
    dropped = [k for k in state if k.startswith(f"{STANDARDIZER}.")]
    if dropped:  # this run's own standardize_features decides its input's standardisation
        log.warning("--init-from %s: its input standardisation is not carried over", ckpt)
        state = {k: v for k, v in state.items() if k not in dropped}
    if src_attention == attention:
        load_state_into(model, state, ckpt, hint=f"--init-from {source}: give a run of this model's size")
        log.info("initialised from %s (same attention %s)", ckpt, attention)
        return
    if src_attention not in (None, "softmax"):
        raise WeightsError(
            f"--init-from {source}: that run used {src_attention!r} attention; give a softmax checkpoint "
            f"(transferred to {attention!r}) or one with {attention!r} attention"
        )
    try:
        new_keys = transfer_softmax_to_seqnorm(state, model)
    except WeightsError as exc:  # of another width: name the file and what to give
        raise WeightsError(f"--init-from {ckpt}: {exc} (give a run of this model's size)") from None
    log.info(
        "initialised %s model from softmax checkpoint %s (%d new tensors)", attention, ckpt, len(new_keys)
    )


def _check_same_task(source: Path, theirs: TaskConfig, ours: TaskConfig) -> None:
    """The run --init-from names learned what this one learns: the same kind, the same outputs."""
    if theirs.kind != ours.kind:
        raise WeightsError(
            f"--init-from {source}: that run learned a {theirs.kind} task ({theirs.name}), this one is "
            f"{ours.kind} ({ours.name}): its head and loss mean something else; give a {ours.kind} run"
        )
    if ours.kind == "categorical" and tuple(theirs.classes) != tuple(ours.classes):
        raise WeightsError(
            f"--init-from {source}: that run's classes {list(theirs.classes)} are not this task's "
            f"{list(ours.classes)} (in order): its outputs would be read as other classes; give a run of "
            "these classes"
        )
    if ours.kind in ("regression", "multi-target") and [t.column for t in theirs.targets] != [
        t.column for t in ours.targets
    ]:
        raise WeightsError(
            f"--init-from {source}: that run's targets {[t.column for t in theirs.targets]} are not "
            f"this task's {[t.column for t in ours.targets]}; give a run of these targets"
        )


__all__ = ["FoldSpec", "StartState", "init_from", "model_kwargs", "run_fold"]

"""`train(...)`: task + inputs + label table -> a run folder with checkpoints, log and test figures.

The run folder's files (config.json, splits.csv, log.csv, best/last.safetensors, resume/, metrics.json,
report.html; with `cv=K` a run folder per fold and a summary at the top) are listed in docs/formats.md;
config.json is the run record (`pipelines.runs.record.RunRecord`).

`train` reads top to bottom: resolve the task, match inputs to labels, split, build the start state
(the one model every fold copies), write the record, run the folds, summarise.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

import torch

from wsi.core.config import config_dict, with_settings
from wsi.core.errors import ConfigError
from wsi.core.files import write_csv_atomic
from wsi.pipelines.inputs import InputAdapter, Item, build_input, with_resolution
from wsi.pipelines.runs.finished import refuse_unfinished
from wsi.pipelines.runs.record import (
    Counts,
    InputRecord,
    RunRecord,
    SplitIds,
    model_uses_positions,
    read_run_record,
    record_path,
    write_run_record,
)
from wsi.pipelines.scheduling.devices import resolve_device
from wsi.pipelines.scheduling.remote import remote_edges
from wsi.pipelines.study.cases import group_by_patient
from wsi.pipelines.study.kinds import TaskKind, build_kind
from wsi.pipelines.study.labels import Matched, match_items, read_label_table
from wsi.pipelines.study.tasks import TaskConfig, load_task
from wsi.pipelines.train.config import TrainOptions
from wsi.pipelines.train.cv import run_folds_on_cluster
from wsi.pipelines.train.folds import FoldSpec, StartState, model_kwargs, run_fold
from wsi.pipelines.train.loop import EpochHook
from wsi.pipelines.train.preflight import refuse_model_for_input, refuse_model_for_kind, refuse_unusable
from wsi.pipelines.train.recipe import apply_recipe, describe_recipe
from wsi.pipelines.train.results import TrainResult, summarise_folds
from wsi.pipelines.train.slide_level import for_features
from wsi.pipelines.train.splits import Split, kfold_items, split_items
from wsi.storage import origin
from wsi.storage.folder_lock import output_lock

log = logging.getLogger(__name__)


def resolve_task(task: str | Path | TaskConfig, options: TrainOptions) -> TaskConfig:
    """The task with the options' changes applied (validated again) and its input switched to slide
    embeddings when --features holds them; the recipe fills the rest once the splits are known."""
    cfg = task if isinstance(task, TaskConfig) else load_task(task)
    changes = options.task_changes(cfg.model.overrides)
    cfg = cfg.replace(**changes) if changes else cfg
    return for_features(cfg, options.features_dir)


def train(
    task: str | Path | TaskConfig,
    *,
    labels_csv: str | Path,
    out_dir: str | Path,
    options: TrainOptions | None = None,
    on_epoch_end: EpochHook | None = None,
    **settings: Any,
) -> TrainResult:
    """Train a task's model on labelled inputs; docs/formats.md (RUN_DIR) lists what `out_dir` receives.

    `options` (or its fields as keywords, `settings`; `TrainOptions` documents each): where the inputs
    are (`features_dir` or `images_dir`), what of the task to change (preset, attention, epochs, seed,
    bag_size, ..., `model_overrides` for `models.build_model`, `overrides` for any task field by dotted
    key), and how to run (device, cv, scheduler, resume, init_from, mpp, progress).
    `on_epoch_end(row)` is called after every epoch with the log row (sequential runs only).
    `labels_csv`, `out_dir`, the input folders and `init_from` may be URLs (`pipelines.scheduling.remote`).
    Every input is checked first: unusable bags are all listed in one BagFormatError, nothing trained.
    """
    opts = with_settings(TrainOptions, options, settings, source="train options")
    start = time.perf_counter()
    result = _train(
        task=task, labels_csv=labels_csv, out_dir=out_dir, features_dir=opts.features_dir,
        images_dir=opts.images_dir, init_from=opts.init_from, on_epoch_end=on_epoch_end, options=opts,
    )  # fmt: skip
    return dataclasses.replace(result, seconds=time.perf_counter() - start)


def _finished_init(kwargs: dict[str, Any]) -> None:
    """--init-from a run whose training still runs or stopped early is refused (unless allow_unfinished),
    as `wsi predict --model` refuses it: its weights are a checkpoint, not the model."""
    options: TrainOptions = kwargs["options"]
    if kwargs.get("init_from") is not None and not options.resume:
        refuse_unfinished(kwargs["init_from"], allow=options.allow_unfinished, option="--init-from")


@remote_edges(
    out="out_dir", files={"labels_csv": "label table"}, runs=("init_from",), hook="on_epoch_end",
    folders={"features_dir": "--features folder", "images_dir": "--images folder"}, units=("resume",),
    guard=_finished_init,
)  # fmt: skip
def _train(
    *, task: str | Path | TaskConfig, labels_csv: str | Path, out_dir: str | Path, features_dir: Any,
    images_dir: Any, init_from: Any, on_epoch_end: EpochHook | None, options: TrainOptions,
) -> TrainResult:  # fmt: skip
    """`train` with its locations local (a URL's mirror or cached copy: `remote_edges`)."""
    opts = dataclasses.replace(
        options, features_dir=_local(features_dir), images_dir=_local(images_dir), init_from=_local(init_from)
    )
    cfg = resolve_task(task, opts)
    adapter = build_input(cfg.input, cfg.input_options)
    kind = build_kind(cfg)
    source = _input_source(adapter, opts)
    rows = read_label_table(labels_csv, task=cfg, kind=kind)
    found = adapter.find([source])
    matched = match_items(rows, found, classes=cfg.classes, labels_path=labels_csv, kind=kind)
    cases = group_by_patient(matched.items, str(labels_csv)) if cfg.level == "patient" else matched.items
    splits = _make_splits(cfg, cases, opts.cv)
    cfg = _with_recipe(cfg, splits, opts)  # the model preset may depend on the cohort size: before the checks
    kind = build_kind(cfg)  # the resolved task: its outputs follow the model's scoring (DSMIL: sigmoid)
    refuse_model_for_kind(cfg)  # CLAM, DSMIL, DTFD-MIL: categorical tasks only
    refuse_model_for_input(cfg)  # a ViT for images does not read bags, nor a bag model images
    adapter = with_resolution(
        adapter, mpp=opts.mpp, mpp_by_slide=matched.mpp_by_slide, uses_positions=_uses_positions(cfg)
    )
    refuse_unusable(adapter, matched.items)  # every bad bag named at once, before anything is written
    architecture = model_kwargs(cfg, kind.num_outputs, adapter.model_kwargs(matched.items))
    start = StartState.build(architecture, seed=cfg.seed)
    init = str(opts.init_from) if opts.init_from else None
    record = RunRecord(
        task=cfg, model=start.architecture(), input=_input_record(cfg, adapter, matched.items),
        classes=cfg.classes, labels_csv=origin(labels_csv), source=origin(source),
        counts=_counts(matched), splits=tuple(_split_ids(s) for s in splits), cv=opts.cv, init_from=init,
        **_machine(resolve_device(opts.device)),
    )  # fmt: skip
    run_dir = Path(out_dir)
    with output_lock(run_dir):  # one writer per run folder (and the checks below see a settled folder)
        _check_resumable(run_dir, record, opts.resume)
        if not record_path(run_dir).is_file():
            write_run_record(run_dir, record)
        sequential = opts.scheduler is None  # progress bars and the epoch hook only in this process
        specs = [
            FoldSpec(
                task=cfg, adapter=adapter, split=split, run_dir=_fold_dir(run_dir, record, kind, k, split),
                start=start, device=opts.device, resume=opts.resume, init_from=_local(opts.init_from),
                progress=opts.progress and sequential, on_epoch_end=on_epoch_end if sequential else None,
                fold=f"fold {k + 1}/{len(splits)}" if opts.cv else "",
            )
            for k, split in enumerate(splits)
        ]  # fmt: skip
        scheduler = opts.scheduler
        fold_metrics = run_folds_on_cluster(specs, scheduler) if scheduler else [run_fold(s) for s in specs]
        if not opts.cv:
            best = run_dir / "best.safetensors"
            return TrainResult.of(run_dir, fold_metrics[0], best, kind)
        return summarise_folds(run_dir, cfg, kind, splits, fold_metrics)


def _local(path: Any) -> Path | None:
    """A location as the local path it is inside `_train` (remote_edges made URLs local)."""
    return None if path is None else Path(path)


def _input_source(adapter: InputAdapter, options: TrainOptions) -> Path:
    """The folder the adapter reads, from the option it needs; a wrong or missing one names it."""
    given = {"--features": options.features_dir, "--images": options.images_dir}
    wanted = given.get(adapter.source_option)
    if wanted is None:
        other = [k for k, v in given.items() if v is not None]
        raise ConfigError(
            f"this task reads input {adapter.name!r}: give {adapter.source_option} DIR"
            + (f" (not {', '.join(other)})" if other else "")
        )
    return Path(wanted)


def _uses_positions(task: TaskConfig) -> bool:
    """Whether the task's model reads tile positions, from its preset and overrides (known before the
    model is built, so the input check can say which bags lack a resolution)."""
    from wsi.models.presets import load_preset

    if task.model.preset is None:  # the recipe fills it before the checks: see train()
        raise ConfigError("the task's model preset is unset: its recipe was not applied")
    return model_uses_positions({**load_preset(task.model.preset).data, **task.model.overrides})


def _with_recipe(task: TaskConfig, splits: Sequence[Split], options: TrainOptions) -> TaskConfig:
    """The task with its recipe's values in every unset field, sized to the smallest training split;
    a model setting the options give that the preset cannot take is refused by name."""
    n_train = min(len(s.train) for s in splits)
    resolved = apply_recipe(task, n_train=n_train, given=options.given_model_settings())
    log.info("%s", describe_recipe(resolved, n_train))
    return resolved


def _make_splits(task: TaskConfig, items: Sequence[Item], cv: int | None) -> list[Split]:
    """K patient-grouped folds, or the task's one train/val/test split."""
    s = task.split
    if cv:
        return kfold_items(items, k=cv, val_fraction=s.val / (s.train + s.val), seed=task.seed)
    return [split_items(items, train=s.train, val=s.val, test=s.test, seed=task.seed)]


def _input_record(task: TaskConfig, adapter: InputAdapter, items: Sequence[Item]) -> InputRecord:
    provenance = adapter.provenance(items)
    return InputRecord(
        name=adapter.name, options=dict(task.input_options), provenance=provenance,
        mpp=getattr(adapter, "mpp", None), mpp_by_slide=dict(getattr(adapter, "mpp_by_slide", {})),
    )  # fmt: skip


def _counts(matched: Matched) -> Counts:
    return Counts(
        slides=len(matched.items),
        patients=len({it.group for it in matched.items}),
        labelled_without_input=len(matched.missing_inputs),
        inputs_without_label=len(matched.unlabelled),
    )


def _split_ids(split: Split) -> SplitIds:
    return SplitIds(*(tuple(it.id for it in part) for part in (split.train, split.val, split.test)))


class _Machine(TypedDict):
    device: str
    amp: str | None
    created: str
    versions: dict[str, str]


def _machine(device: torch.device) -> _Machine:
    """Where and with what the run trains: device, mixed precision, start time, versions."""
    from wsi.core.version import __version__

    return {
        "device": str(device),
        "amp": "bf16" if device.type == "cuda" else None,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {"wsi": __version__, "torch": torch.__version__, "python": platform.python_version()},
    }


def _check_resumable(run_dir: Path, record: RunRecord, resume: bool) -> None:
    """A folder holding a run is continued only with --resume, and only with the same task and data.

    A run that never finished an epoch (a start that failed: a crash, a full disk, an interrupt before
    the first epoch's weights) holds nothing to keep or resume: its records are removed and the run
    starts afresh, so a failed start never blocks the next run or --resume."""
    if not record_path(run_dir).is_file():
        return
    if not _has_progress(run_dir):
        log.warning("%s: an earlier start finished no epoch; starting afresh", run_dir)
        for config in [record_path(run_dir), *(record_path(d) for d in run_dir.glob("fold-*"))]:
            config.unlink(missing_ok=True)
        return
    if not resume and (run_dir / "metrics.json").is_file():  # finished: --resume has nothing to go on with
        raise ConfigError(
            f"{run_dir} holds a finished training run (its test figures: {run_dir / 'metrics.json'}); "
            "give another --out to train again"
        )
    if not resume:
        raise ConfigError(
            f"{run_dir} already holds a training run; use --resume to continue it or another --out"
        )
    saved, wanted = config_dict(read_run_record(run_dir)), config_dict(record)
    for key in ("task", "model", "splits", "input"):
        if saved[key] != wanted[key]:
            raise ConfigError(
                f"cannot resume {run_dir}: its {key} differs from this call's "
                "(same task, options and inputs are needed); start a new --out instead"
            )


def _has_progress(run_dir: Path) -> bool:
    """Whether a run folder holds a finished epoch (weights or resume state) in itself or a fold."""
    names = ("best.safetensors", "last.safetensors", "metrics.json", "resume/state.json")
    return any((d / n).is_file() for d in [run_dir, *run_dir.glob("fold-*")] for n in names)


def _split_rows(kind: TaskKind, split: Split) -> list[list[str]]:
    """splits.csv rows: one per slide (a patient case lists each of its slides)."""
    return [
        [sid, it.group, *kind.format_target(it.target), part]
        for part, items in (("train", split.train), ("val", split.val), ("test", split.test))
        for it in items
        for sid in ([s for s, _ in it.slides] or [it.id])
    ]


def _fold_dir(run_dir: Path, record: RunRecord, kind: TaskKind, k: int, split: Split) -> Path:
    """The folder fold k trains into, with its splits.csv (and for CV its own config.json)."""
    fold_dir = run_dir / f"fold-{k + 1}" if record.cv else run_dir
    fold_dir.mkdir(parents=True, exist_ok=True)
    if record.cv and not record_path(fold_dir).is_file():
        write_run_record(fold_dir, dataclasses.replace(record, fold=k + 1, splits=(record.splits[k],)))
    header = ["slide", "patient", *kind.target_names, "split"]
    write_csv_atomic(fold_dir / "splits.csv", header, _split_rows(kind, split))
    return fold_dir


__all__ = ["Item", "TrainOptions", "TrainResult", "resolve_task", "train"]

"""`train(...)`: task + inputs + label table -> a run folder with checkpoints, log and test figures.

Run folder (`out_dir`):
  config.json            the run record (`pipelines.run_record.RunRecord`): resolved task, model
                         architecture, input adapter + provenance (encoder id, weights sha256, tile
                         size/params), label/source paths, counts, splits, versions
  fitted.json            values fitted on the training split that predict needs (regression: target
                         mean/std; survival: the median training risk); absent for categorical tasks
  splits.csv             slide, patient, label (other kinds: their target columns), split
  log.csv                per epoch: train_loss, val_loss, the kind's validation figures (categorical:
                         val_auroc, val_accuracy), lr, seconds, peak_mem_mb
  best.safetensors       weights of the best epoch (categorical: validation AUROC, ties by validation
                         loss; survival: validation C-index; regression and multi-target: validation loss)
  last.safetensors       weights after the last epoch
  resume/                optimizer, scheduler, RNG and early-stopping state of the last epoch (for --resume)
  test_predictions.csv   slide (patient at level: patient), labels, outputs (prob_<class>..., predicted;
                         pred_<target>; risk, risk_group) for the best weights
  metrics.json           the kind's test figures with 95% bootstrap intervals (categorical: AUROC,
                         average precision, accuracy, balanced accuracy, confusion matrix)
  report.html, report/   the statistics report and the CSVs behind it (pipelines.report)
  roc.png | scatter.png | km.png   the kind's main test figure
With `cv=K`: config.json, folds.csv, metrics.json (mean/std per figure, each fold's, and the pooled
test predictions' figures) and report.html (per-fold and pooled curves) at the top, and a full run
folder per fold in fold-<k>/.

`train` reads top to bottom: resolve the task, match inputs to labels, split, build the start state
(the one model every fold copies), write the record, run the folds, summarise.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from wsi.config import config_dict
from wsi.errors import ConfigError
from wsi.files import write_csv_atomic, write_json_atomic
from wsi.output_lock import output_lock
from wsi.pipelines.cases import group_by_patient
from wsi.pipelines.devices import resolve_device
from wsi.pipelines.inputs import InputAdapter, Item, build_input, with_resolution
from wsi.pipelines.labels import Matched, match_items, read_label_table
from wsi.pipelines.report import write_report
from wsi.pipelines.run_record import (
    Counts,
    InputRecord,
    RunRecord,
    SplitIds,
    model_uses_positions,
    read_run_record,
    record_path,
    write_run_record,
)
from wsi.pipelines.task_kinds import PredictionSet, TaskKind, build_kind
from wsi.pipelines.tasks import TaskConfig, load_task
from wsi.pipelines.train import metrics
from wsi.pipelines.train.cv import run_folds_on_cluster
from wsi.pipelines.train.folds import FoldSpec, StartState, model_kwargs, run_fold
from wsi.pipelines.train.loop import EpochHook
from wsi.pipelines.train.preflight import refuse_model_for_kind, refuse_unusable
from wsi.pipelines.train.recipe import apply_recipe
from wsi.pipelines.train.slide_level import for_features
from wsi.pipelines.train.splits import Split, kfold_items, split_items

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_dir: Path
    metrics: dict[str, Any]  # what metrics.json holds
    config_path: Path
    best_checkpoint: Path | None  # None at the top of a cross-validation run
    kind: TaskKind  # the run's task kind (summary keys and lines; unfitted: each fold fits its own)
    folds: list[TrainResult] = field(default_factory=list)


def resolve_task(
    task: str | Path | TaskConfig,
    *,
    attention: str | None = None,
    epochs: int | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    grad_accum: int | None = None,
    model_overrides: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> TaskConfig:
    """The task with command-line style changes applied (and validated again)."""
    cfg = task if isinstance(task, TaskConfig) else load_task(task)
    changes: dict[str, Any] = dict(overrides or {})
    for key, value in (
        ("model.attention", attention), ("epochs", epochs), ("seed", seed), ("batch_size", batch_size),
        ("grad_accum", grad_accum),
    ):  # fmt: skip
        if value is not None:
            changes[key] = value
    if model_overrides:
        changes["model.overrides"] = {**cfg.model.overrides, **dict(model_overrides)}
    return cfg.replace(**changes) if changes else cfg


def train(
    *,
    task: str | Path | TaskConfig,
    labels_csv: str | Path,
    out_dir: str | Path,
    features_dir: str | Path | None = None,
    images_dir: str | Path | None = None,
    attention: str | None = None,
    device: str = "auto",
    cv: int | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    init_from: str | Path | None = None,
    epochs: int | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    grad_accum: int | None = None,
    model_overrides: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    progress: bool = True,
    on_epoch_end: EpochHook | None = None,
    mpp: float | None = None,
) -> TrainResult:
    """Train a task's model on labelled inputs; see the module docstring for what `out_dir` receives.

    `model_overrides` go to `models.build_model` (e.g. {"dim": 32, "depth": 1}); `overrides` change any
    task field by dotted key (e.g. {"optimizer.lr": 3e-4, "input_options.bag_size": 512}).
    `on_epoch_end(row)` is called after every epoch with the log row (sequential runs only).
    `mpp`: level-0 um/px of every slide whose bag stores pixel coordinates (CLAM, TRIDENT); an `mpp`
    column of the labels CSV wins per slide. Only a model that uses tile positions needs one.
    Every input is checked first: unusable bags are all listed in one BagFormatError, nothing trained.
    """
    cfg = resolve_task(
        task, attention=attention, epochs=epochs, seed=seed, batch_size=batch_size, grad_accum=grad_accum,
        model_overrides=model_overrides, overrides=overrides,
    )  # fmt: skip
    cfg = for_features(cfg, features_dir)  # slide embeddings: a head instead of a MIL model
    adapter = build_input(cfg.input, cfg.input_options)
    kind = build_kind(cfg)
    source = _input_source(adapter, features_dir, images_dir)
    rows = read_label_table(labels_csv, task=cfg, kind=kind)
    found = adapter.find([source])
    matched = match_items(rows, found, classes=cfg.classes, labels_path=labels_csv, kind=kind)
    cases = group_by_patient(matched.items, str(labels_csv)) if cfg.level == "patient" else matched.items
    splits = _make_splits(cfg, cases, cv)
    cfg = _with_recipe(cfg, splits)  # the model preset may depend on the cohort size: before the checks
    refuse_model_for_kind(cfg)  # CLAM, DSMIL, DTFD-MIL: categorical tasks only
    adapter = with_resolution(
        adapter, mpp=mpp, mpp_by_slide=matched.mpp_by_slide, uses_positions=_uses_positions(cfg)
    )
    refuse_unusable(adapter, matched.items)  # every bad bag named at once, before anything is written
    architecture = model_kwargs(cfg, kind.num_outputs, adapter.model_kwargs(matched.items))
    start = StartState.build(architecture, seed=cfg.seed)
    record = RunRecord(
        task=cfg, model=start.architecture(), input=_input_record(cfg, adapter, matched.items),
        classes=cfg.classes, labels_csv=str(Path(labels_csv).resolve()), source=str(source.resolve()),
        counts=_counts(matched), splits=tuple(_split_ids(s) for s in splits), cv=cv,
        init_from=str(init_from) if init_from else None, **_machine(resolve_device(device)),
    )  # fmt: skip
    run_dir = Path(out_dir)
    with output_lock(run_dir):  # one writer per run folder (and the checks below see a settled folder)
        _check_resumable(run_dir, record, resume)
        if not record_path(run_dir).is_file():
            write_run_record(run_dir, record)
        sequential = scheduler is None  # progress bars and the epoch hook only in this process
        specs = [
            FoldSpec(
                task=cfg, adapter=adapter, split=split, run_dir=_fold_dir(run_dir, record, kind, k, split),
                start=start, device=device, resume=resume, init_from=Path(init_from) if init_from else None,
                progress=progress and sequential, on_epoch_end=on_epoch_end if sequential else None,
            )
            for k, split in enumerate(splits)
        ]  # fmt: skip
        fold_metrics = run_folds_on_cluster(specs, scheduler) if scheduler else [run_fold(s) for s in specs]
        if not cv:
            best = run_dir / "best.safetensors"
            return TrainResult(run_dir, fold_metrics[0], record_path(run_dir), best, kind)
        return _summarise_folds(run_dir, cfg, kind, splits, fold_metrics)


def _input_source(adapter: InputAdapter, features_dir: Any, images_dir: Any) -> Path:
    """The folder the adapter reads, from the option it needs; a wrong or missing one names it."""
    given = {"--features": features_dir, "--images": images_dir}
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
    from wsi import configs

    if task.model.preset is None:  # the recipe fills it before the checks: see train()
        raise ConfigError("the task's model preset is unset: its recipe was not applied")
    preset, _ = configs.load_yaml("models", task.model.preset)
    return model_uses_positions({**preset, **task.model.overrides})


def _with_recipe(task: TaskConfig, splits: Sequence[Split]) -> TaskConfig:
    """The task with its recipe's values in every unset field, sized to the smallest training split."""
    n_train = min(len(s.train) for s in splits)
    resolved = apply_recipe(task, n_train=n_train)
    log.info(
        "recipe %s: preset %s (%d training cases), tile share %s, selection %s",
        task.recipe, resolved.model.preset, n_train, list(resolved.augment.tile_fraction or ()),
        resolved.selection.metric,
    )  # fmt: skip
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


def _machine(device: torch.device) -> dict[str, Any]:
    """Where and with what the run trains: device, mixed precision, start time, versions."""
    from wsi import __version__

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


def _summarise_folds(
    run_dir: Path,
    task: TaskConfig,
    kind: TaskKind,
    splits: Sequence[Split],
    fold_metrics: list[dict[str, Any]],
) -> TrainResult:
    """metrics.json (mean and std of each figure, every fold's, and the pooled test predictions'),
    folds.csv and the cross-validation report (per-fold and pooled curves) at the top."""
    fold_dirs = [run_dir / f"fold-{k + 1}" for k in range(len(splits))]
    sets = [
        kind.read_predictions(d / f"{m.get('split', 'test')}_predictions.csv", f"fold-{k + 1}")
        for k, (d, m) in enumerate(zip(fold_dirs, fold_metrics, strict=True))
    ]
    pooled = PredictionSet.pool(sets)
    pooled_metrics = metrics.json_safe(kind.evaluate(pooled, n_bootstrap=task.bootstrap, seed=task.seed))
    summary = {
        "folds": len(splits), "kind": kind.name, **metrics.summarize(fold_metrics, kind.summary_keys),
        "pooled": pooled_metrics, "per_fold": fold_metrics,
    }  # fmt: skip
    write_json_atomic(run_dir / "metrics.json", summary)
    fold_rows = (
        [sid, it.group, *kind.format_target(it.target), k + 1]
        for k, s in enumerate(splits)
        for it in s.test
        for sid in ([x for x, _ in it.slides] or [it.id])
    )
    write_csv_atomic(run_dir / "folds.csv", ["slide", "patient", *kind.target_names, "test_fold"], fold_rows)
    by_set = {s.name: m for s, m in zip(sets, fold_metrics, strict=True)} | {"pooled": pooled_metrics}
    summary_rows = [[key, summary[key]["mean"], summary[key]["std"]] for key in kind.summary_keys]
    write_report(
        run_dir, kind=kind, sets=[*sets, pooled], metrics=by_set, summary=summary_rows, seed=task.seed,
        title=f"{task.name}: {len(splits)}-fold cross-validation",
    )  # fmt: skip
    head = summary[kind.summary_keys[0]]
    log.info(
        "cross-validation %s %s +- %s over %d folds (pooled: %s)",
        kind.summary_keys[0], head["mean"], head["std"], len(splits), kind.summary_line(pooled_metrics),
    )  # fmt: skip
    folds = [
        TrainResult(d, m, record_path(d), d / "best.safetensors", kind)
        for d, m in zip(fold_dirs, fold_metrics, strict=True)
    ]
    return TrainResult(run_dir, summary, record_path(run_dir), None, kind, folds)


__all__ = ["Item", "TrainResult", "resolve_task", "train"]

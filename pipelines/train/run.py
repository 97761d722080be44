"""`train(...)`: task + inputs + label table -> a run folder with checkpoints, log and test figures.

Run folder (`out_dir`):
  config.json            resolved task, model architecture (`model.config`), input stage + provenance
                         (encoder id, weights sha256, tile size/params), label/source paths, counts, versions
  splits.csv             slide, patient, label, split (train | val | test)
  log.csv                per epoch: train_loss, val_loss, val_auroc, val_accuracy, lr, seconds, peak_mem_mb
  best.safetensors       weights of the best epoch (validation AUROC, ties by validation loss)
  last.safetensors       weights after the last epoch
  resume/                optimizer, scheduler, RNG and early-stopping state of the last epoch (for --resume)
  test_predictions.csv   slide, label, prob_<class>..., predicted (for the best weights)
  metrics.json           test AUROC + 95% bootstrap CI, accuracy, balanced accuracy, confusion matrix
  roc.png                test ROC curve
With `cv=K`: config.json, folds.csv and metrics.json (mean/std per figure) at the top, and a full run
folder per fold in fold-<k>/.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from pipelines.devices import resolve_device
from pipelines.inputs import InputAdapter, Item, build_input
from pipelines.train import checkpoints, loop, metrics
from pipelines.train.labels import match_items, read_labels
from pipelines.train.splits import Split, kfold_items, split_items
from pipelines.train.tasks import TaskConfig, load_task, task_from_dict
from wsi.errors import ConfigError, WeightsError
from wsi.files import write_text_atomic

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_dir: Path
    metrics: dict[str, Any]  # what metrics.json holds
    config_path: Path
    best_checkpoint: Path | None  # None at the top of a cross-validation run
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


def _source(stage: InputAdapter, features_dir: Any, images_dir: Any) -> Path:
    given = {"--features": features_dir, "--images": images_dir}
    wanted = given.get(stage.source_option)
    if wanted is None:
        other = [k for k, v in given.items() if v is not None]
        raise ConfigError(
            f"this task reads input {stage.name!r}: give {stage.source_option} DIR"
            + (f" (not {', '.join(other)})" if other else "")
        )
    return Path(wanted)


def _model_spec(task: TaskConfig, stage_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of `models.build_model`: preset, attention, data-given sizes, overrides."""
    return {
        "preset": task.model.preset,
        "attention": task.model.attention,
        "num_classes": len(task.classes),
        **dict(stage_kwargs),
        **task.model.overrides,
    }


def build_from_spec(spec: Mapping[str, Any]) -> torch.nn.Module:
    from models.presets import build_model

    spec = dict(spec)
    return build_model(spec.pop("preset"), **spec)


def _init_from(model: torch.nn.Module, source: Path, attention: str) -> None:
    """Start from another run's weights: same attention -> load; softmax -> transfer to softmax-free."""
    from models.presets import transfer_softmax_to_seqnorm

    ckpt = source / "best.safetensors" if source.is_dir() else source
    cfg_path = ckpt.parent / "config.json"
    src_attention = None
    if cfg_path.is_file():
        src_attention = (
            json.loads(cfg_path.read_text(encoding="utf-8")).get("task", {}).get("model", {}).get("attention")
        )
    if src_attention == attention:
        checkpoints.load_into(model, ckpt)
        log.info("initialised from %s (same attention %s)", ckpt, attention)
        return
    if src_attention not in (None, "softmax"):
        raise WeightsError(
            f"--init-from {source}: that run used {src_attention!r} attention; give a softmax checkpoint "
            f"(transferred to {attention!r}) or one with {attention!r} attention"
        )
    new_keys = transfer_softmax_to_seqnorm(checkpoints.load_weights(ckpt), model)
    log.info(
        "initialised %s model from softmax checkpoint %s (%d new tensors)", attention, ckpt, len(new_keys)
    )


def run_fold(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one split into one folder. Top level and picklable: dask workers call it for CV folds."""
    task = task_from_dict(spec["task"], source="run config")
    stage = build_input(task.input, task.input_options)
    loop.seed_everything(task.seed)
    device = resolve_device(spec["device"])
    model = build_from_spec(spec["model"])
    run_dir = Path(spec["run_dir"])
    if spec.get("init_from") and not checkpoints.has_resume(run_dir):
        _init_from(model, Path(spec["init_from"]), task.model.attention)
    result = loop.fit(
        task=task, stage=stage, split=spec["split"], model=model, run_dir=run_dir, device=device,
        resume=spec["resume"], progress=spec["progress"], on_epoch_end=spec.get("on_epoch_end"),
    )  # fmt: skip
    return result.metrics


def _write_splits(path: Path, split: Split, classes: Sequence[str]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["slide", "patient", "label", "split"])
    for sid, patient, label, part in split.rows():
        writer.writerow([sid, patient, classes[label], part])
    write_text_atomic(path, buf.getvalue())


def _check_resumable(run_dir: Path, config: dict[str, Any], resume: bool) -> None:
    cfg_path = run_dir / "config.json"
    if not cfg_path.is_file():
        return
    if not resume:
        raise ConfigError(
            f"{run_dir} already holds a training run; use --resume to continue it or another --out"
        )
    saved = json.loads(cfg_path.read_text(encoding="utf-8"))
    for key in ("task", "model_spec", "splits"):
        if saved.get(key) != json.loads(json.dumps(config.get(key))):  # compare as JSON (tuples -> lists)
            raise ConfigError(
                f"cannot resume {run_dir}: its {key} differs from this call's "
                "(same task, options and inputs are needed); start a new --out instead"
            )


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
    on_epoch_end: Callable[[dict[str, Any]], None] | None = None,
) -> TrainResult:
    """Train a task's model on labelled inputs; see the module docstring for what `out_dir` receives.

    `model_overrides` go to `models.build_model` (e.g. {"dim": 32, "depth": 1}); `overrides` change any
    task field by dotted key (e.g. {"optimizer.lr": 3e-4, "input_options.bag_size": 512}).
    `on_epoch_end(row)` is called after every epoch with the log row (sequential runs only).
    """
    cfg = resolve_task(
        task, attention=attention, epochs=epochs, seed=seed, batch_size=batch_size, grad_accum=grad_accum,
        model_overrides=model_overrides, overrides=overrides,
    )  # fmt: skip
    stage = build_input(cfg.input, cfg.input_options)
    source = _source(stage, features_dir, images_dir)
    run_dir = Path(out_dir)
    found = stage.find([source])
    rows = read_labels(labels_csv, classes=cfg.classes, columns=cfg.columns)
    matched = match_items(rows, found, classes=cfg.classes, labels_path=labels_csv)
    items = matched.items
    model_spec = _model_spec(cfg, stage.model_kwargs(items))
    provenance = stage.provenance(items)
    resolved_device = resolve_device(device)
    if cv:
        splits = kfold_items(
            items, k=cv, val_fraction=cfg.split.val / (cfg.split.train + cfg.split.val), seed=cfg.seed
        )
    else:
        splits = [
            split_items(items, train=cfg.split.train, val=cfg.split.val, test=cfg.split.test, seed=cfg.seed)
        ]
    probe = build_from_spec(model_spec)  # fails early on a bad preset/override, and records the architecture
    config = {
        "task": cfg.to_dict(),
        "model_spec": model_spec,
        "model": probe.config_dict() if hasattr(probe, "config_dict") else None,
        "input": {"name": stage.name, "options": dict(cfg.input_options), "provenance": provenance},
        "classes": list(cfg.classes),
        "labels_csv": str(Path(labels_csv).resolve()),
        "source": str(source.resolve()),
        "counts": {
            "slides": len(items),
            "patients": len({it.group for it in items}),
            "labelled_without_input": len(matched.missing_inputs),
            "inputs_without_label": len(matched.unlabelled),
        },
        "splits": [{p: [it.id for it in getattr(s, p)] for p in ("train", "val", "test")} for s in splits],
        "cv": cv,
        "init_from": str(init_from) if init_from else None,
        "device": str(resolved_device),
        "amp": "bf16" if resolved_device.type == "cuda" else None,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": _versions(),
    }
    del probe
    _check_resumable(run_dir, config, resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "config.json").is_file():
        write_text_atomic(run_dir / "config.json", json.dumps(config, indent=2) + "\n")

    fold_dirs = [run_dir / f"fold-{k + 1}" for k in range(len(splits))] if cv else [run_dir]
    specs = []
    for k, (split, fdir) in enumerate(zip(splits, fold_dirs, strict=True)):
        fdir.mkdir(parents=True, exist_ok=True)
        if cv:
            fold_cfg = {**config, "fold": k + 1, "splits": [config["splits"][k]]}
            if not (fdir / "config.json").is_file():
                write_text_atomic(fdir / "config.json", json.dumps(fold_cfg, indent=2) + "\n")
        _write_splits(fdir / "splits.csv", split, cfg.classes)
        specs.append({
            "task": cfg.to_dict(), "model": model_spec, "split": split, "run_dir": str(fdir),
            "device": device, "resume": resume, "init_from": str(init_from) if init_from else None,
            "progress": progress and scheduler is None,
            "on_epoch_end": on_epoch_end if scheduler is None else None,
        })  # fmt: skip

    if scheduler is not None:
        from pipelines.train.cv import run_folds_on_cluster

        fold_metrics = run_folds_on_cluster(specs, scheduler)
    else:
        fold_metrics = [run_fold(s) for s in specs]

    if not cv:
        return TrainResult(run_dir, fold_metrics[0], run_dir / "config.json", run_dir / "best.safetensors")
    summary = {"folds": cv, **metrics.summarize(fold_metrics), "per_fold": fold_metrics}
    write_text_atomic(run_dir / "metrics.json", json.dumps(summary, indent=2) + "\n")
    _write_fold_table(run_dir / "folds.csv", splits, cfg.classes)
    auc = summary["auroc"]
    log.info("cross-validation AUROC %s +- %s over %d folds", auc["mean"], auc["std"], cv)
    folds = [
        TrainResult(d, m, d / "config.json", d / "best.safetensors")
        for d, m in zip(fold_dirs, fold_metrics, strict=True)
    ]
    return TrainResult(run_dir, summary, run_dir / "config.json", None, folds)


def _write_fold_table(path: Path, splits: Sequence[Split], classes: Sequence[str]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["slide", "patient", "label", "test_fold"])
    for k, split in enumerate(splits):
        for it in split.test:
            writer.writerow([it.id, it.group, classes[it.label], k + 1])
    write_text_atomic(path, buf.getvalue())


def _versions() -> dict[str, str]:
    from wsi import __version__

    return {"wsi": __version__, "torch": torch.__version__, "python": platform.python_version()}


__all__ = ["Item", "TrainResult", "build_from_spec", "resolve_task", "run_fold", "train"]

"""The generic training loop: one model, one split, one run folder.

It knows nothing about bags or images: batches come from an input stage (`pipelines.inputs`) as
`Batch(x, labels, ids, extra)` and go to `model(x, **extra)`. Per epoch it writes the log, the last
weights, the best weights (by validation AUROC, ties broken by validation loss) and the resume state;
at the end it scores the best weights on the test split.

CUDA path: bf16 autocast, pinned host memory and non-blocking copies, and no host synchronisation per
step (the loss is summed on the device and read once per epoch).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import random
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from pipelines.devices import autocast_for
from pipelines.inputs import Batch, InputAdapter, Item
from pipelines.train import checkpoints, metrics
from pipelines.train.splits import Split
from pipelines.train.tasks import TaskConfig
from wsi.files import write_text_atomic

log = logging.getLogger(__name__)

LOG_COLUMNS = (
    "epoch", "train_loss", "val_loss", "val_auroc", "val_accuracy", "lr", "seconds", "peak_mem_mb",
)  # fmt: skip


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # every device


def _peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**20
    # CPU: the process's peak resident set (KiB on Linux, bytes on macOS); not reset per epoch
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


def make_loader(
    stage: InputAdapter,
    items: Sequence[Item],
    *,
    train: bool,
    batch_size: int,
    num_workers: int,
    device: torch.device,
    generator: torch.Generator | None = None,
) -> DataLoader[Any]:
    return DataLoader(
        stage.dataset(items, train=train),
        batch_size=batch_size,
        shuffle=train,
        generator=generator if train else None,
        num_workers=num_workers,
        collate_fn=stage.collate,
        pin_memory=device.type == "cuda",
        persistent_workers=False,
    )


def _forward(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    return model(batch.x.float() if batch.x.dtype == torch.float16 else batch.x, **batch.extra)


def train_epoch(
    model: torch.nn.Module,
    loader: DataLoader[Any],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    *,
    device: torch.device,
    grad_accum: int = 1,
    grad_clip: float | None = None,
    class_weights: torch.Tensor | None = None,
    progress: bool = False,
    desc: str = "train",
) -> float:
    """One pass over `loader`; returns the mean loss (the only host sync of the epoch)."""
    model.train()
    autocast = autocast_for(device)
    total = torch.zeros((), device=device)
    n_batches = len(loader)
    optimizer.zero_grad(set_to_none=True)
    for step, batch in enumerate(tqdm(loader, desc=desc, leave=False, disable=not progress, file=sys.stderr)):
        if batch.x.shape[0] == 0:  # every item of this batch failed to decode (reported by the stage)
            continue
        batch = batch.to(device)
        with autocast():
            logits = _forward(model, batch)  # (B, C)
        loss = F.cross_entropy(logits.float(), batch.labels, weight=class_weights)
        (loss / grad_accum).backward()
        total += loss.detach()
        if (step + 1) % grad_accum == 0 or step + 1 == n_batches:
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None:
                scheduler.step()
    return float(total.item()) / max(n_batches, 1)


@torch.inference_mode()
def predict_loader(
    model: torch.nn.Module, loader: DataLoader[Any], *, device: torch.device
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(ids, labels (n,), probabilities (n, C)) in loader order; one host sync at the end."""
    model.eval()
    autocast = autocast_for(device)
    ids: list[str] = []
    labels: list[torch.Tensor] = []
    probs: list[torch.Tensor] = []
    for batch in loader:
        if batch.x.shape[0] == 0:
            continue
        batch = batch.to(device)
        with autocast():
            logits = _forward(model, batch)
        probs.append(torch.softmax(logits.float(), dim=-1))
        labels.append(batch.labels)
        ids.extend(batch.ids)
    if not ids:
        return [], np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
    return ids, torch.cat(labels).cpu().numpy(), torch.cat(probs).cpu().numpy()


def _val_loss(labels: np.ndarray, probs: np.ndarray) -> float:
    if len(labels) == 0:
        return math.nan
    p = np.clip(probs[np.arange(len(labels)), labels], 1e-12, 1.0)
    return float(-np.log(p).mean())


def _score(val_auroc: float, val_loss: float) -> tuple[float, float]:
    """Larger is better: AUROC first (NaN counts as worst), then lower loss."""
    return (
        -math.inf if math.isnan(val_auroc) else val_auroc,
        -val_loss if not math.isnan(val_loss) else -math.inf,
    )


def make_optimizer(model: torch.nn.Module, task: TaskConfig) -> torch.optim.Optimizer:
    opt = task.optimizer
    cuda = next(model.parameters()).device.type == "cuda"
    # fused: one kernel for the whole update on CUDA instead of a few per parameter tensor
    return torch.optim.AdamW(model.parameters(), lr=opt.lr, weight_decay=opt.weight_decay, fused=cuda or None)


def make_scheduler(
    optimizer: torch.optim.Optimizer, task: TaskConfig, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    if task.optimizer.scheduler == "none":
        return None
    total = max(1, task.epochs * steps_per_epoch)
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)


def class_weights_for(task: TaskConfig, items: Sequence[Item], device: torch.device) -> torch.Tensor | None:
    if task.class_weighting == "none":
        return None
    counts = np.bincount([it.label for it in items], minlength=len(task.classes)).astype(np.float64)
    weights = len(items) / (len(task.classes) * np.maximum(counts, 1))
    return torch.tensor(weights, dtype=torch.float32, device=device)


@dataclass
class FitResult:
    run_dir: Path
    metrics: dict[str, Any]
    best_epoch: int
    epochs_run: int


def _write_log(path: Path, rows: list[dict[str, Any]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=LOG_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, buf.getvalue())


def _write_predictions(
    path: Path, ids: list[str], labels: np.ndarray, probs: np.ndarray, classes: Sequence[str]
) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["slide", "label", *[f"prob_{c}" for c in classes], "predicted"])
    for i, sid in enumerate(ids):
        writer.writerow(
            [sid, classes[labels[i]], *[f"{p:.6f}" for p in probs[i]], classes[int(probs[i].argmax())]]
        )
    write_text_atomic(path, buf.getvalue())


def fit(
    *,
    task: TaskConfig,
    stage: InputAdapter,
    split: Split,
    model: torch.nn.Module,
    run_dir: Path,
    device: torch.device,
    resume: bool = False,
    progress: bool = True,
    on_epoch_end: Callable[[dict[str, Any]], None] | None = None,
) -> FitResult:
    """Train `model` on `split` into `run_dir` (which already holds config.json), then test it."""
    run_dir = Path(run_dir)
    model.to(device)
    g = torch.Generator()
    g.manual_seed(task.seed)
    train_loader = make_loader(
        stage, split.train, train=True, batch_size=task.batch_size, num_workers=task.num_workers,
        device=device, generator=g,
    )  # fmt: skip
    eval_kw = {
        "train": False,
        "batch_size": task.batch_size,
        "num_workers": task.num_workers,
        "device": device,
    }
    val_loader = make_loader(stage, split.val, **eval_kw)
    optimizer = make_optimizer(model, task)
    steps = math.ceil(len(train_loader) / task.grad_accum)
    scheduler = make_scheduler(optimizer, task, steps)
    weights = class_weights_for(task, split.train, device)

    progress_state: dict[str, Any] = {
        "epoch": 0, "best_score": None, "best_epoch": 0, "bad_epochs": 0, "log": [], "done": False,
    }  # fmt: skip
    if resume and checkpoints.has_resume(run_dir):
        progress_state = checkpoints.load_resume(
            run_dir, model=model, optimizer=optimizer, scheduler=scheduler, loader_generator=g
        )
        log.info("resuming %s after epoch %d", run_dir, progress_state["epoch"])

    bar = tqdm(
        total=task.epochs, initial=progress_state["epoch"], desc=f"epochs ({run_dir.name})",
        disable=not progress, file=sys.stderr,
    )  # fmt: skip
    while not progress_state["done"] and progress_state["epoch"] < task.epochs:
        epoch = progress_state["epoch"] + 1
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        train_loss = train_epoch(
            model, train_loader, optimizer, scheduler, device=device, grad_accum=task.grad_accum,
            grad_clip=task.optimizer.grad_clip, class_weights=weights, progress=progress,
            desc=f"epoch {epoch}",
        )  # fmt: skip
        _, val_labels, val_probs = predict_loader(model, val_loader, device=device)
        val_auroc = metrics.auroc(val_labels, val_probs) if len(val_labels) else math.nan
        val_loss = _val_loss(val_labels, val_probs)
        val_acc = float((val_probs.argmax(1) == val_labels).mean()) if len(val_labels) else math.nan
        row = {
            "epoch": epoch,
            "train_loss": round(train_loss, 6),
            "val_loss": round(val_loss, 6),
            "val_auroc": round(val_auroc, 6),
            "val_accuracy": round(val_acc, 6),
            "lr": optimizer.param_groups[0]["lr"],
            "seconds": round(time.perf_counter() - t0, 3),
            "peak_mem_mb": round(_peak_mem_mb(device), 1),
        }
        score = _score(val_auroc, val_loss)
        best = progress_state["best_score"]
        if best is None or score > tuple(best):
            progress_state.update(best_score=list(score), best_epoch=epoch, bad_epochs=0)
            checkpoints.save_weights(model, run_dir / "best.safetensors", {"epoch": str(epoch)})
        else:
            progress_state["bad_epochs"] += 1
        checkpoints.save_weights(model, run_dir / "last.safetensors", {"epoch": str(epoch)})
        progress_state["epoch"] = epoch
        progress_state["log"].append(row)
        if task.patience and progress_state["bad_epochs"] >= task.patience:
            progress_state["done"] = True
            log.info("early stop after epoch %d (best %d)", epoch, progress_state["best_epoch"])
        _write_log(run_dir / "log.csv", progress_state["log"])
        checkpoints.save_resume(
            run_dir, model=model, optimizer=optimizer, scheduler=scheduler, loader_generator=g,
            progress=progress_state,
        )  # fmt: skip
        bar.update(1)
        bar.set_postfix(loss=f"{train_loss:.3f}", val_auroc=f"{val_auroc:.3f}")
        if on_epoch_end is not None:
            on_epoch_end(row)
    bar.close()
    progress_state["done"] = True

    # score the best weights on the test split (or on validation when the task keeps no test split)
    checkpoints.load_into(model, run_dir / "best.safetensors")
    eval_split, eval_items = ("test", split.test) if split.test else ("val", split.val)
    ids, labels, probs = predict_loader(model, make_loader(stage, eval_items, **eval_kw), device=device)
    figures = metrics.evaluate(labels, probs, task.classes, n_bootstrap=task.bootstrap, seed=task.seed)
    _write_predictions(run_dir / f"{eval_split}_predictions.csv", ids, labels, probs, task.classes)
    metrics.plot_roc(labels, probs, task.classes, run_dir / "roc.png", title=f"{task.name}: {eval_split} ROC")
    best_row = progress_state["log"][progress_state["best_epoch"] - 1] if progress_state["log"] else {}
    result = {
        "split": eval_split,
        **figures,
        "best_epoch": progress_state["best_epoch"],
        "epochs_run": progress_state["epoch"],
        "best_val_auroc": best_row.get("val_auroc"),
    }
    result = metrics.json_safe(result)
    write_text_atomic(run_dir / "metrics.json", json.dumps(result, indent=2) + "\n")
    lo, hi = figures["auroc_ci95"]
    log.info(
        "%s AUROC %s (95%% CI %s-%s), accuracy %s, balanced accuracy %s on %d slides",
        eval_split, _fmt(figures["auroc"]), _fmt(lo), _fmt(hi), _fmt(figures["accuracy"]),
        _fmt(figures["balanced_accuracy"]), figures["n"],
    )  # fmt: skip
    return FitResult(run_dir, result, progress_state["best_epoch"], progress_state["epoch"])


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"

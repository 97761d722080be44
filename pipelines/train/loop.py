"""The generic training loop: one model, one split, one run folder.

It knows nothing about bags or images: batches come from an input adapter (`pipelines.inputs`) as
`Batch(x, labels, ids, extra)` and go to `model(x, **extra)`. `fit` reads top to bottom: set up the
loaders and optimizer, start (or resume), then per epoch train, validate, keep the best and last
weights, write the log and the resume state, and stop early when validation stops improving. Scoring
the best weights on the test split is `pipelines.train.evaluate`'s job.

CUDA path: bf16 autocast, pinned host memory and non-blocking copies, and no host synchronisation per
step (the loss is summed on the device and read once per epoch).
"""

from __future__ import annotations

import logging
import math
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

from pipelines.checkpoints import save_weights
from pipelines.devices import autocast_for
from pipelines.inputs import Batch, InputAdapter, Item
from pipelines.tasks import TaskConfig
from pipelines.train import metrics
from pipelines.train.optim import make_optimizer, make_scheduler
from pipelines.train.splits import Split
from pipelines.train.state import TrainState, has_resume, load_resume, save_resume
from wsi.files import write_csv_atomic

log = logging.getLogger(__name__)

LOG_COLUMNS = (
    "epoch", "train_loss", "val_loss", "val_auroc", "val_accuracy", "lr", "seconds", "peak_mem_mb",
)  # fmt: skip

EpochHook = Callable[[dict[str, Any]], None]


# ------------------------------------------------------------------------------------ building blocks


def make_loader(
    adapter: InputAdapter,
    items: Sequence[Item],
    *,
    train: bool,
    batch_size: int,
    num_workers: int,
    device: torch.device,
    generator: torch.Generator | None = None,
) -> DataLoader[Any]:
    return DataLoader(
        adapter.dataset(items, train=train),
        batch_size=batch_size,
        shuffle=train,
        generator=generator if train else None,
        num_workers=num_workers,
        collate_fn=adapter.collate,
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
        if batch.x.shape[0] == 0:  # every item of this batch failed to decode (reported by the adapter)
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


def class_weights_for(task: TaskConfig, items: Sequence[Item], device: torch.device) -> torch.Tensor | None:
    if task.class_weighting == "none":
        return None
    counts = np.bincount([it.label for it in items], minlength=len(task.classes)).astype(np.float64)
    weights = len(items) / (len(task.classes) * np.maximum(counts, 1))
    return torch.tensor(weights, dtype=torch.float32, device=device)


def _peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**20
    # CPU: the process's peak resident set (KiB on Linux, bytes on macOS); not reset per epoch
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


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


# ---------------------------------------------------------------------------------------------- fit


@dataclass
class Trainer:
    """What every epoch of one `fit` uses: the model, its data, optimizer and schedule."""

    task: TaskConfig
    model: torch.nn.Module
    device: torch.device
    train_loader: DataLoader[Any]
    val_loader: DataLoader[Any]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    class_weights: torch.Tensor | None
    generator: torch.Generator  # shuffles the training loader; saved with the resume state

    @classmethod
    def build(
        cls,
        task: TaskConfig,
        adapter: InputAdapter,
        split: Split,
        model: torch.nn.Module,
        device: torch.device,
    ) -> Trainer:
        generator = torch.Generator()
        generator.manual_seed(task.seed)

        def loader(items: Sequence[Item], train: bool) -> DataLoader[Any]:
            return make_loader(
                adapter, items, train=train, batch_size=task.batch_size, num_workers=task.num_workers,
                device=device, generator=generator,
            )  # fmt: skip

        train_loader = loader(split.train, train=True)
        optimizer = make_optimizer(model, task)
        steps_per_epoch = math.ceil(len(train_loader) / task.grad_accum)
        return cls(
            task=task, model=model, device=device, train_loader=train_loader,
            val_loader=loader(split.val, train=False), optimizer=optimizer,
            scheduler=make_scheduler(optimizer, task, steps_per_epoch),
            class_weights=class_weights_for(task, split.train, device), generator=generator,
        )  # fmt: skip

    def start(self, run_dir: Path, *, resume: bool) -> TrainState:
        """A fresh state, or the one saved in `run_dir` (restoring weights, optimizer and RNG)."""
        if not (resume and has_resume(run_dir)):
            return TrainState()
        state = load_resume(
            run_dir, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            loader_generator=self.generator,
        )  # fmt: skip
        log.info("resuming %s after epoch %d", run_dir, state.epoch)
        return state

    def run_epoch(self, epoch: int, *, progress: bool) -> tuple[dict[str, Any], tuple[float, float]]:
        """Train one epoch and validate: (the log row, the score that picks the best epoch)."""
        task, device = self.task, self.device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        train_loss = train_epoch(
            self.model, self.train_loader, self.optimizer, self.scheduler, device=device,
            grad_accum=task.grad_accum, grad_clip=task.optimizer.grad_clip, class_weights=self.class_weights,
            progress=progress, desc=f"epoch {epoch}",
        )  # fmt: skip
        _, labels, probs = predict_loader(self.model, self.val_loader, device=device)
        val_auroc = metrics.auroc(labels, probs) if len(labels) else math.nan
        val_loss = _val_loss(labels, probs)
        val_acc = float((probs.argmax(1) == labels).mean()) if len(labels) else math.nan
        row = {
            "epoch": epoch,
            "train_loss": round(train_loss, 6),
            "val_loss": round(val_loss, 6),
            "val_auroc": round(val_auroc, 6),
            "val_accuracy": round(val_acc, 6),
            "lr": self.optimizer.param_groups[0]["lr"],
            "seconds": round(time.perf_counter() - t0, 3),
            "peak_mem_mb": round(_peak_mem_mb(device), 1),
        }
        return row, _score(val_auroc, val_loss)

    def end_epoch(
        self, state: TrainState, row: dict[str, Any], score: tuple[float, float], run_dir: Path
    ) -> None:
        """Keep the best and last weights, count epochs without progress, save the log and resume state."""
        epoch = row["epoch"]
        if state.best_score is None or score > state.best_score:
            state.best_score, state.best_epoch, state.bad_epochs = score, epoch, 0
            save_weights(self.model, run_dir / "best.safetensors", {"epoch": str(epoch)})
        else:
            state.bad_epochs += 1
        save_weights(self.model, run_dir / "last.safetensors", {"epoch": str(epoch)})
        state.epoch = epoch
        state.log.append(row)
        if self.task.patience and state.bad_epochs >= self.task.patience:
            state.done = True
            log.info("early stop after epoch %d (best %d)", epoch, state.best_epoch)
        write_csv_atomic(run_dir / "log.csv", LOG_COLUMNS, ([r[c] for c in LOG_COLUMNS] for r in state.log))
        save_resume(
            run_dir, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            loader_generator=self.generator, state=state,
        )  # fmt: skip


def fit(
    *,
    task: TaskConfig,
    adapter: InputAdapter,
    split: Split,
    model: torch.nn.Module,
    run_dir: Path,
    device: torch.device,
    resume: bool = False,
    progress: bool = True,
    on_epoch_end: EpochHook | None = None,
) -> TrainState:
    """Train `model` on `split` into `run_dir` (which already holds config.json); returns the final
    state. `run_dir` then holds best.safetensors (best validation epoch), last.safetensors and log.csv."""
    run_dir = Path(run_dir)
    trainer = Trainer.build(task, adapter, split, model.to(device), device)
    state = trainer.start(run_dir, resume=resume)
    bar = tqdm(
        total=task.epochs, initial=state.epoch, desc=f"epochs ({run_dir.name})", disable=not progress,
        file=sys.stderr,
    )  # fmt: skip
    while not state.finished(task.epochs):
        row, score = trainer.run_epoch(state.epoch + 1, progress=progress)
        trainer.end_epoch(state, row, score, run_dir)
        bar.update(1)
        bar.set_postfix(loss=f"{row['train_loss']:.3f}", val_auroc=f"{row['val_auroc']:.3f}")
        if on_epoch_end is not None:
            on_epoch_end(row)
    bar.close()
    state.done = True
    return state


__all__ = [
    "LOG_COLUMNS",
    "Trainer",
    "class_weights_for",
    "fit",
    "make_loader",
    "predict_loader",
    "train_epoch",
]

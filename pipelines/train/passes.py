"""Passes of a model over a loader: one training epoch (`train_epoch`: a loss per batch or per set of
bags, optimizer steps), and passes without gradients (validation, test, prediction of a run's splits),
with the figures every pass reports (peak memory). One host synchronisation per pass; a NaN or infinite
loss, gradient or output stops it, naming the bags (`pipelines.train.finite`)."""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from wsi.core.errors import ConfigError
from wsi.core.progress import progress as progress_bar
from wsi.models.base.objectives import LossInputs, Objective, before_optimizer_step, training_step
from wsi.pipelines.inputs import Batch
from wsi.pipelines.scheduling.devices import autocast_for
from wsi.pipelines.study.kinds import TaskKind
from wsi.pipelines.train.finite import FiniteWatch, check_outputs


def forward_batch(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The model's logits (B, C) on a batch already on its device (float16 features cast up)."""
    return model(batch.x.float() if batch.x.dtype == torch.float16 else batch.x, **batch.model_inputs())


@dataclass
class Predicted:
    """A model's outputs on a loader, in loader order (host arrays)."""

    ids: list[str]
    labels: np.ndarray  # (n,) int64 batch labels (categorical: the class)
    targets: np.ndarray  # (n, T) float target vectors
    logits: np.ndarray  # (n, C) float32
    outputs: np.ndarray  # (n, K) the kind's outputs (probabilities, values, risk)


@torch.inference_mode()
def predict_loader(
    model: torch.nn.Module, loader: DataLoader[Any], *, device: torch.device, kind: TaskKind
) -> Predicted:
    """Every case of `loader` through the model; one host sync at the end."""
    model.eval()
    autocast = autocast_for(device)
    ids: list[str] = []
    labels: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    logits_all: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    for batch in loader:
        if batch.x.shape[0] == 0:
            continue
        batch = batch.to(device)
        with autocast():
            logits = forward_batch(model, batch)
        outputs.append(kind.outputs(logits))
        logits_all.append(logits.float())
        labels.append(batch.labels)
        if batch.targets is not None:
            targets.append(batch.targets)
        ids.extend(batch.ids)
    n_t, n_o = len(kind.target_names), kind.num_outputs
    if not ids:
        no_logits = np.zeros((0, n_o), dtype=np.float32)
        return Predicted([], np.zeros(0, dtype=np.int64), np.zeros((0, n_t)), no_logits, no_logits.copy())
    out = torch.cat(outputs).cpu().numpy()
    check_outputs(ids, out)  # no figure and no class from a NaN output
    return Predicted(
        ids=ids,
        labels=torch.cat(labels).cpu().numpy(),
        targets=torch.cat(targets).cpu().numpy().astype(np.float64) if targets else np.zeros((len(ids), n_t)),
        logits=torch.cat(logits_all).cpu().numpy(),
        outputs=out,
    )


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**20
    # CPU: the process's peak resident set (KiB on Linux, bytes on macOS); not reset per epoch
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


__all__ = ["Predicted", "forward_batch", "peak_mem_mb", "predict_loader"]


# ------------------------------------------------------------------------------------ training pass
_forward = forward_batch  # the training pass's forward, by a name tests can replace


def _training_forward(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, Objective | None]:
    """(logits (B, C), the model's own objective or None): `_forward` for models without one."""
    if not callable(getattr(model, "training_step", None)):
        return _forward(model, batch), None
    x = batch.x.float() if batch.x.dtype == torch.float16 else batch.x
    step = training_step(model, x, **batch.model_inputs())
    return step.logits, step.objective


@dataclass(frozen=True)
class EpochOptions:
    """How one training pass runs besides the model, data and optimizer: the loss (`kind`, class
    weights), the step (gradient accumulation and clipping), the batches' augmentation and the bar."""

    grad_accum: int = 1
    grad_clip: float | None = None
    class_weights: torch.Tensor | None = None
    progress: bool = False
    desc: str = "train"
    kind: TaskKind | None = None
    augment: Callable[[Batch], Batch] | None = None


def train_epoch(
    model: torch.nn.Module,
    loader: DataLoader[Any],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    *,
    device: torch.device,
    options: EpochOptions | None = None,
) -> float:
    """One pass over `loader`; returns the mean loss per loss computed (the only host sync of the
    epoch). Without `options.kind`: cross-entropy on the batch labels (a categorical task).
    `options.augment` changes each batch on the device before the model sees it (tile subsets, feature
    dropout: training only).

    A kind whose loss needs a set of bags (`group_bags` > 1, survival) keeps each batch's logits until
    the set is complete, then computes one loss over the set; the optimizer steps every `grad_accum`
    losses (batches, when each batch is its own loss)."""
    opts = options or EpochOptions()
    grad_accum, grad_clip, augment, desc = opts.grad_accum, opts.grad_clip, opts.augment, opts.desc
    kind, class_weights, progress = opts.kind, opts.class_weights, opts.progress
    model.train()
    autocast = autocast_for(device)
    total = torch.zeros((), device=device)
    n_batches = len(loader)
    pending = _PendingLoss(kind, class_weights)
    watch = FiniteWatch(device, epoch_desc=desc)  # a NaN loss or gradient stops the run, naming the bags
    optimizer.zero_grad(set_to_none=True)
    steps = progress_bar(loader, desc=desc, unit="step", leave=False, disable=not progress)
    for step, batch in enumerate(steps):
        last = step + 1 == n_batches
        if batch.x.shape[0] == 0 and not (last and pending.batches):  # every item failed to decode
            continue
        if batch.x.shape[0]:
            batch = batch.to(device)
            if augment is not None:
                batch = augment(batch)
            with autocast():
                pending.add(batch, *_training_forward(model, batch))
        if not (pending.complete() or last):
            continue
        loss, ids = pending.take()
        watch.loss(loss, ids)
        (loss / grad_accum).backward()
        total += loss.detach()
        counter = step + 1 if pending.group_bags == 1 else pending.n_losses
        if counter % grad_accum == 0 or last:
            _optimizer_step(model, optimizer, scheduler, grad_clip, watch)
    watch.check()
    return float(total.item()) / max(n_batches if pending.group_bags == 1 else pending.n_losses, 1)


@dataclass
class _PendingLoss:
    """The batches kept for one loss: one batch, or a set of `group_bags` bags (a Cox loss)."""

    kind: TaskKind | None
    class_weights: torch.Tensor | None
    batches: list[tuple[torch.Tensor, Batch]] = field(default_factory=list)
    objective: Objective | None = None  # the model's own objective, from the latest forward
    n_losses: int = 0

    @property
    def group_bags(self) -> int:
        return self.kind.group_bags if self.kind is not None else 1

    def add(self, batch: Batch, logits: torch.Tensor, objective: Objective | None) -> None:
        self.batches.append((logits, batch))
        self.objective = objective

    def complete(self) -> bool:
        return sum(b.x.shape[0] for _, b in self.batches) >= self.group_bags

    def take(self) -> tuple[torch.Tensor, list[str]]:
        """(the loss over the kept batches, their bags' ids); the next loss starts empty."""
        if self.objective is None:
            loss = _group_loss(self.batches, self.kind, self.class_weights)
        else:
            loss = _objective_loss(self.batches, self.objective, self.kind, self.class_weights)
        ids = [i for _, b in self.batches for i in b.ids]
        self.batches = []
        self.n_losses += 1
        return loss, ids


def _optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    grad_clip: float | None,
    watch: FiniteWatch,
) -> None:
    """The model's own gradient handling (DTFD-MIL's per-tier clipping), clipping to `grad_clip`, the
    gradient norm's check, then the step, the cleared gradients and the schedule's step."""
    before_optimizer_step(model)
    if grad_clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    watch.gradient(norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()


def _group_loss(
    pending: list[tuple[torch.Tensor, Batch]], kind: TaskKind | None, class_weights: torch.Tensor | None
) -> torch.Tensor:
    """The loss over the batches kept for one loss (one batch, or a set of bags for a Cox loss)."""
    if len(pending) == 1:
        logits, batch = pending[0]
        labels, targets = batch.labels, batch.targets
    else:
        logits = torch.cat([lg for lg, _ in pending])
        labels = torch.cat([b.labels for _, b in pending])
        targets = torch.cat([b.targets for _, b in pending if b.targets is not None])
    if kind is None:
        return F.cross_entropy(logits.float(), labels, weight=class_weights)
    if targets is None:
        raise ValueError("batches reach the loss without targets; build loaders with pipelines.study.cases")
    return kind.loss(logits.float(), targets, labels)


def _objective_loss(
    pending: list[tuple[torch.Tensor, Batch]],
    objective: Objective,
    kind: TaskKind | None,
    class_weights: torch.Tensor | None,
) -> torch.Tensor:
    """A model's own objective over one batch, given the task's loss of any (B, C) logits of its bags
    (models with an objective train categorical tasks: one batch is one loss)."""
    if len(pending) != 1:
        raise ConfigError("a model with its own training objective cannot pool bags into one loss")
    batch = pending[0][1]

    def task_loss(logits: torch.Tensor) -> torch.Tensor:
        return _group_loss([(logits, batch)], kind, class_weights)

    weights = class_weights if kind is None else getattr(kind, "class_weights", None)
    return objective(LossInputs(task_loss=task_loss, labels=batch.labels, class_weights=weights))

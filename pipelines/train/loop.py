"""The generic training loop: one model, one split, one run folder.

It knows nothing about bags or images, nor about what is learned: batches come from an input adapter
(`pipelines.inputs`, through `pipelines.cases`) as `Batch(x, labels, ids, mask, coords_um, targets)`
and go to `model(x, **batch.model_inputs())`; the task kind (`pipelines.task_kinds`) turns logits into
a loss (over `group_bags` bags:
a Cox loss needs a set of them), into outputs, and into the validation figures that pick the best epoch.
A model kind with its authors' own training objective (CLAM's instance loss, DSMIL's two streams,
DTFD-MIL's tiers) gives it through `models.objectives`: the loop asks `training_step` for the logits
and the objective, and lets the model touch its gradients (`before_optimizer_step`) before the step.
`fit` reads top to bottom: set up the loaders and optimizer, start (or resume), then per epoch train,
validate, keep the best weights, write the log, last weights and resume state (when the best epoch
changes, every STATE_EVERY_S and at the end), and stop early when validation stops improving. Inputs
of a small cohort are read once and held in memory (PRELOAD_BYTES). Scoring the best weights on the
test split is `pipelines.train.evaluate`'s job.

CUDA path: bf16 autocast, pinned host memory and non-blocking copies, and no host synchronisation per
step (the loss is summed on the device and read once per epoch).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from wsi.core.errors import ConfigError
from wsi.core.files import write_csv_atomic
from wsi.core.progress import progress as progress_bar
from wsi.models.base.objectives import LossInputs, Objective, before_optimizer_step, training_step
from wsi.models.layers.standardize import input_standardizer
from wsi.pipelines.inputs import Batch, InputAdapter, Item
from wsi.pipelines.runs.checkpoints import save_weights
from wsi.pipelines.scheduling.devices import autocast_for
from wsi.pipelines.study.cases import make_loader
from wsi.pipelines.study.kinds import TaskKind
from wsi.pipelines.study.tasks import TaskConfig
from wsi.pipelines.train.augment import BagAugment
from wsi.pipelines.train.finite import FiniteWatch
from wsi.pipelines.train.optim import make_optimizer, make_scheduler
from wsi.pipelines.train.passes import Predicted, forward_batch, peak_mem_mb, predict_loader
from wsi.pipelines.train.recipe import is_resolved
from wsi.pipelines.train.selection import Selection
from wsi.pipelines.train.splits import Split
from wsi.pipelines.train.state import TrainState, has_resume, load_resume, save_resume

log = logging.getLogger(__name__)

LOG_COLUMNS = (
    "epoch", "train_loss", "val_loss", "val_auroc", "val_accuracy", "lr", "seconds", "peak_mem_mb",
)  # fmt: skip  (a categorical task's; other kinds put their own validation figures after val_loss)

EpochHook = Callable[[dict[str, Any]], None]

#: inputs whose files total at most this many bytes are read once per loader and kept in memory
PRELOAD_BYTES = 512 * 2**20
#: the resume state, last.safetensors and log.csv are written at most this often (and whenever the best
#: epoch changes, and at the end): an epoch of a small cohort takes milliseconds, its state as long
STATE_EVERY_S = 30.0


def log_columns(kind: TaskKind) -> tuple[str, ...]:
    return ("epoch", "train_loss", "val_loss", *kind.val_columns, "lr", "seconds", "peak_mem_mb")


# ------------------------------------------------------------------------------------ building blocks


_forward = forward_batch  # one name per module: tests replace the training pass's forward


def _training_forward(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, Objective | None]:
    """(logits (B, C), the model's own objective or None): `_forward` for models without one."""
    if not callable(getattr(model, "training_step", None)):
        return _forward(model, batch), None
    x = batch.x.float() if batch.x.dtype == torch.float16 else batch.x
    step = training_step(model, x, **batch.model_inputs())
    return step.logits, step.objective


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
    kind: TaskKind | None = None,
    augment: Callable[[Batch], Batch] | None = None,
) -> float:
    """One pass over `loader`; returns the mean loss per loss computed (the only host sync of the
    epoch). Without `kind`: cross-entropy on the batch labels (a categorical task). `augment` changes
    each batch on the device before the model sees it (tile subsets, feature dropout: training only).

    A kind whose loss needs a set of bags (`group_bags` > 1, survival) keeps each batch's logits until
    the set is complete, then computes one loss over the set; the optimizer steps every `grad_accum`
    losses (batches, when each batch is its own loss)."""
    model.train()
    autocast = autocast_for(device)
    total = torch.zeros((), device=device)
    n_batches = len(loader)
    group_bags = kind.group_bags if kind is not None else 1
    pending: list[tuple[torch.Tensor, Batch]] = []
    objective: Objective | None = None  # the model's own objective for the pending batch, if it has one
    n_losses = 0
    watch = FiniteWatch(device, epoch_desc=desc)  # a NaN loss or gradient stops the run, naming the bags
    optimizer.zero_grad(set_to_none=True)
    steps = progress_bar(loader, desc=desc, unit="step", leave=False, disable=not progress)
    for step, batch in enumerate(steps):
        last = step + 1 == n_batches
        if batch.x.shape[0] == 0 and not (last and pending):  # every item failed to decode (reported)
            continue
        if batch.x.shape[0]:
            batch = batch.to(device)
            if augment is not None:
                batch = augment(batch)
            with autocast():
                logits, objective = _training_forward(model, batch)
            pending.append((logits, batch))
        if sum(b.x.shape[0] for _, b in pending) < group_bags and not last:
            continue
        if objective is None:
            loss = _group_loss(pending, kind, class_weights)
        else:
            loss = _objective_loss(pending, objective, kind, class_weights)
        watch.loss(loss, [i for _, b in pending for i in b.ids])
        pending = []
        (loss / grad_accum).backward()
        total += loss.detach()
        n_losses += 1
        counter = step + 1 if group_bags == 1 else n_losses
        if counter % grad_accum == 0 or last:
            before_optimizer_step(model)  # a model's own gradient handling (DTFD-MIL's per-tier clipping)
            if grad_clip is not None:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            else:
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                norm = torch.nn.utils.get_total_norm(grads)
            watch.gradient(norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None:
                scheduler.step()
    watch.check()
    return float(total.item()) / max(n_batches if group_bags == 1 else n_losses, 1)


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
        raise ValueError("batches reach the loss without targets; build loaders with pipelines.cases")
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


# ---------------------------------------------------------------------------------------------- fit


@dataclass
class Trainer:
    """What every epoch of one `fit` uses: the model, its data, optimizer and schedule, and the kind."""

    task: TaskConfig
    kind: TaskKind  # fitted on the training split (class weights, standardisation)
    model: torch.nn.Module
    device: torch.device
    train_loader: DataLoader[Any]
    val_loader: DataLoader[Any]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    generator: torch.Generator  # shuffles the training loader; saved with the resume state
    augment: BagAugment | None  # training batches only (pipelines.train.augment)
    selection: Selection  # the score that picks best.safetensors, and weight averaging
    saved_at: float = -math.inf  # time.monotonic() of the last resume state written

    @classmethod
    def build(
        cls,
        task: TaskConfig,
        kind: TaskKind,
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
                device=device, generator=generator, n_targets=len(kind.target_names),
                preload_bytes=PRELOAD_BYTES, balanced=task.sampling == "balanced",
            )  # fmt: skip

        train_loader = loader(split.train, train=True)
        optimizer = make_optimizer(model, task)
        batches_per_loss = math.ceil(kind.group_bags / task.batch_size)
        losses_per_epoch = math.ceil(len(train_loader) / batches_per_loss)
        steps_per_epoch = math.ceil(losses_per_epoch / (task.grad_accum or 1))
        return cls(
            task=task, kind=kind, model=model, device=device, train_loader=train_loader,
            val_loader=loader(split.val, train=False), optimizer=optimizer,
            scheduler=make_scheduler(optimizer, task, steps_per_epoch), generator=generator,
            augment=BagAugment.of(task, center=_input_mean(model)), selection=Selection.of(task),
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
            grad_accum=task.grad_accum or 1, grad_clip=task.optimizer.grad_clip, progress=progress,
            desc=f"epoch {epoch}", kind=self.kind, augment=self.augment,
        )  # fmt: skip
        val = predict_loader(self.model, self.val_loader, device=device, kind=self.kind)
        val_loss, figures, score = self.kind.validation(val.targets, val.outputs, val.logits)
        score = self.selection.figure(score, val.labels, val.outputs, self.kind.num_outputs)
        row = {
            "epoch": epoch,
            "train_loss": round(train_loss, 6),
            "val_loss": round(val_loss, 6),
            **{name: round(value, 6) for name, value in figures.items()},
            "lr": self.optimizer.param_groups[0]["lr"],
            "seconds": round(time.perf_counter() - t0, 3),
            "peak_mem_mb": round(peak_mem_mb(device), 1),
        }
        return row, score

    def end_epoch(
        self,
        state: TrainState,
        row: dict[str, Any],
        score: tuple[float, float],
        run_dir: Path,
        *,
        final: bool = False,
    ) -> None:
        """Keep the best weights, count epochs without progress, and save the log, last weights and
        resume state when due: the best epoch changed (so best.safetensors and the resume state always
        agree), STATE_EVERY_S passed since the last save, or the run ends (`final`, early stop).
        A resumed run re-runs the epochs after the last save."""
        epoch = row["epoch"]
        score = self.selection.score(state.log, row, score)
        self.selection.remember(self.model, run_dir, epoch)
        eligible = self.selection.eligible(epoch, int(self.task.epochs or epoch))
        improved = eligible and (state.best_score is None or score > state.best_score)
        if improved:
            state.best_score, state.best_epoch, state.bad_epochs = score, epoch, 0
            self.selection.save_best(self.model, run_dir / "best.safetensors", epoch)
        elif eligible:
            state.bad_epochs += 1
        state.epoch = epoch
        state.log.append(row)
        patience, at_least = self.task.patience, self.task.min_epochs or 0
        if patience and state.bad_epochs >= patience and epoch >= at_least:  # patience 0 / None: never
            state.done = True
            log.info("early stop after epoch %d (best %d)", epoch, state.best_epoch)
        if improved or final or state.done or time.monotonic() - self.saved_at >= STATE_EVERY_S:
            self.save(state, run_dir)

    def save(self, state: TrainState, run_dir: Path) -> None:
        """log.csv, last.safetensors and the resume state after `state.epoch`."""
        save_weights(self.model, run_dir / "last.safetensors", {"epoch": str(state.epoch)})
        columns = log_columns(self.kind)
        write_csv_atomic(run_dir / "log.csv", columns, ([r[c] for c in columns] for r in state.log))
        save_resume(
            run_dir, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            loader_generator=self.generator, state=state,
        )  # fmt: skip
        self.saved_at = time.monotonic()


def _input_mean(model: torch.nn.Module) -> torch.Tensor | None:
    """The mean of the model's input standardisation (what feature dropout drops a feature to)."""
    module = input_standardizer(model)
    return None if module is None else module.mean.detach().clone()


def require_recipe(task: TaskConfig) -> int:
    """The task's epoch budget; a ConfigError when its recipe was never applied (fields left None)."""
    if not is_resolved(task) or task.epochs is None:
        raise ConfigError(
            f"task {task.name!r} has fields its recipe fills still unset: train it through "
            "wsi.pipelines.train.train, or apply wsi.pipelines.train.recipe.apply_recipe first"
        )
    return task.epochs


def _shown(value: float) -> str:
    """An epoch figure for the progress line: 3 decimals, "n/a" where it was not estimable (NaN)."""
    return "n/a" if value is None or not math.isfinite(float(value)) else f"{float(value):.3f}"


def fit(
    *,
    task: TaskConfig,
    kind: TaskKind,
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
    epochs = require_recipe(task)
    trainer = Trainer.build(task, kind, adapter, split, model.to(device), device)
    state = trainer.start(run_dir, resume=resume)
    bar = progress_bar(
        total=epochs, initial=state.epoch, desc=f"epochs ({run_dir.name})", unit="epoch", disable=not progress
    )
    while not state.finished(epochs):
        row, score = trainer.run_epoch(state.epoch + 1, progress=progress)
        trainer.end_epoch(state, row, score, run_dir, final=row["epoch"] >= epochs)
        bar.update(1)
        figure = kind.val_columns[0] if kind.val_columns else "val_loss"
        bar.set_postfix({"loss": f"{row['train_loss']:.3f}", figure: _shown(row[figure])})
        if on_epoch_end is not None:
            on_epoch_end(row)
    bar.close()
    state.done = True
    trainer.selection.finish(run_dir)
    return state


__all__ = [
    "LOG_COLUMNS",
    "PRELOAD_BYTES",
    "STATE_EVERY_S",
    "Predicted",
    "Trainer",
    "fit",
    "log_columns",
    "make_loader",
    "predict_loader",
    "train_epoch",
]

"""The generic training loop: one model, one split, one run folder.

It knows nothing about bags or images, nor about what is learned: batches come from an input adapter
(through `pipelines.study.cases`), each epoch's pass is `pipelines.train.passes.train_epoch`, and the
task kind (`pipelines.study.kinds`) turns the validation outputs into the figures that pick the best
epoch. `fit` reads top to bottom: start or resume the `Trainer`, then per epoch train, validate, keep
the best weights, and save the log, last weights and resume state when due. Small cohorts' inputs are
read once and held in memory (PRELOAD_BYTES). CUDA: bf16 autocast, pinned memory, non-blocking copies,
and no host synchronisation per step (the loss is summed on the device and read once per epoch).
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
from torch.utils.data import DataLoader

from wsi.core.errors import ConfigError
from wsi.core.files import write_csv_atomic
from wsi.core.progress import progress as progress_bar
from wsi.models.layers.standardize import input_standardizer
from wsi.pipelines.inputs import InputAdapter, Item
from wsi.pipelines.runs.checkpoints import save_weights
from wsi.pipelines.study.cases import CaseDataset, make_loader
from wsi.pipelines.study.kinds import TaskKind
from wsi.pipelines.study.tasks import TaskConfig
from wsi.pipelines.train.augment import BagAugment
from wsi.pipelines.train.optim import make_optimizer, make_scheduler
from wsi.pipelines.train.passes import EpochOptions, Predicted, peak_mem_mb, predict_loader, train_epoch
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


@dataclass
class Trainer:
    """What every epoch of one `fit` uses: the model, its data, optimizer and schedule, and the kind;
    `evaluate_best` then scores the best weights on the same split."""

    task: TaskConfig
    kind: TaskKind  # fitted on the training split (class weights, standardisation)
    adapter: InputAdapter
    split: Split
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
        """The loaders, optimizer and schedule of `model` (on `device`); a ConfigError when the task's
        recipe was never applied."""
        require_recipe(task)
        generator = torch.Generator()
        generator.manual_seed(task.seed)

        def loader(items: Sequence[Item], train: bool) -> DataLoader[Any]:
            cases = CaseDataset(adapter, items, train=train, n_targets=len(kind.target_names))
            return make_loader(
                cases, batch_size=task.batch_size, num_workers=task.num_workers, device=device,
                generator=generator, preload_bytes=PRELOAD_BYTES, balanced=task.sampling == "balanced",
            )  # fmt: skip

        train_loader = loader(split.train, train=True)
        optimizer = make_optimizer(model, task)
        batches_per_loss = math.ceil(kind.group_bags / task.batch_size)
        losses_per_epoch = math.ceil(len(train_loader) / batches_per_loss)
        steps_per_epoch = math.ceil(losses_per_epoch / (task.grad_accum or 1))
        return cls(
            task=task, kind=kind, adapter=adapter, split=split, model=model, device=device,
            train_loader=train_loader,
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
        options = EpochOptions(
            grad_accum=task.grad_accum or 1, grad_clip=task.optimizer.grad_clip, progress=progress,
            desc=f"epoch {epoch}", kind=self.kind, augment=self.augment,
        )  # fmt: skip
        train_loss = train_epoch(
            self.model, self.train_loader, self.optimizer, self.scheduler, device=device, options=options
        )
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
    trainer: Trainer,
    run_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    on_epoch_end: EpochHook | None = None,
) -> TrainState:
    """Train the trainer's model on its split into `run_dir` (which already holds config.json); returns
    the final state. `run_dir` then holds best.safetensors (best validation epoch), last.safetensors and
    log.csv."""
    run_dir = Path(run_dir)
    epochs, kind = require_recipe(trainer.task), trainer.kind
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

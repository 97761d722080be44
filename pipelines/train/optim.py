"""The optimizer and learning-rate schedule a task asks for.

`make_optimizer` is the one place the optimizer is built: which parameters decay is
`models.param_groups`'s rule (weight matrices only: never norms, biases, the class token).
"""

from __future__ import annotations

import math

import torch

from wsi.models.base.param_groups import param_groups
from wsi.pipelines.study.tasks import TaskConfig


def make_optimizer(model: torch.nn.Module, task: TaskConfig) -> torch.optim.Optimizer:
    """AdamW with the task's learning rate, weight decay on weight matrices only."""
    opt = task.optimizer
    cuda = next(model.parameters()).device.type == "cuda"
    groups = param_groups(model, float(opt.weight_decay or 0.0))
    # fused: one kernel for the whole update on CUDA instead of a few per parameter tensor
    return torch.optim.AdamW(groups, lr=_required(opt.lr, "optimizer.lr"), fused=cuda or None)


def make_scheduler(
    optimizer: torch.optim.Optimizer, task: TaskConfig, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """Stepped per optimizer step: a linear warm-up over `optimizer.warmup_epochs`, then cosine decay to
    0 at `epochs` (scheduler: cosine) or the peak rate (none); None for a constant rate."""
    opt = task.optimizer
    epochs = _required(task.epochs, "epochs")
    warmup = int(opt.warmup_epochs or 0) * steps_per_epoch
    total = max(1, int(epochs) * steps_per_epoch)
    if not warmup:
        if opt.scheduler in (None, "none"):
            return None
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    cosine = opt.scheduler == "cosine"

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)  # never 0: the first step already moves the weights
        if not cosine:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _required(value: float | int | None, name: str) -> float:
    if value is None:  # a task that skipped pipelines.train.recipe.apply_recipe
        raise ValueError(f"{name} is unset: resolve the task's recipe first (pipelines.train.recipe)")
    return float(value)


__all__ = ["make_optimizer", "make_scheduler"]

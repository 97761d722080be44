"""The optimizer and learning-rate schedule a task asks for.

`make_optimizer` is the one place the optimizer is built: a change to which parameters decay (norms,
biases, the class token) is one line here.
"""

from __future__ import annotations

import torch

from pipelines.tasks import TaskConfig


def make_optimizer(model: torch.nn.Module, task: TaskConfig) -> torch.optim.Optimizer:
    """AdamW over every parameter with the task's learning rate and weight decay."""
    opt = task.optimizer
    cuda = next(model.parameters()).device.type == "cuda"
    params = model.parameters()
    # fused: one kernel for the whole update on CUDA instead of a few per parameter tensor
    return torch.optim.AdamW(params, lr=opt.lr, weight_decay=opt.weight_decay, fused=cuda or None)


def make_scheduler(
    optimizer: torch.optim.Optimizer, task: TaskConfig, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """Cosine decay to 0 over `task.epochs` (stepped per optimizer step), or None for a constant rate."""
    if task.optimizer.scheduler == "none":
        return None
    total = max(1, task.epochs * steps_per_epoch)
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)


__all__ = ["make_optimizer", "make_scheduler"]

"""The optimizer and learning-rate schedule a task asks for.

`make_optimizer` is the one place the optimizer is built (`adamw`, `adam`, `lookahead-radam`), with the
weight decay on the parameters `optimizer.weight_decay_on` picks (`decay_groups`). `make_scheduler`'s
schedules are stepped once per optimizer step: `cosine` after a linear warm-up; `cosine-epochs`
(DSMIL's CosineAnnealingLR stepped per epoch) and `multistep` (DTFD-MIL's MultiStepLR) as the closed
forms of torch's schedulers at the epoch index.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from wsi.models.base.param_groups import param_groups
from wsi.pipelines.study.tasks import TaskConfig

#: TransMIL's Lookahead (szc19990412/TransMIL MyOptimizer/lookahead.py:13 @ 9d6aee57c7c7): alpha, k
LOOKAHEAD_ALPHA, LOOKAHEAD_K = 0.5, 6


class LookaheadRAdam(torch.optim.RAdam):
    """RAdam (decoupled weight decay, as timm's RAdam TransMIL copies: MyOptimizer/radam.py:73-74)
    inside Lookahead (Zhang et al. 2019): every k steps the slow weights move alpha of the way to the
    fast ones and the fast weights are reset to them. Our own code, read from szc19990412/TransMIL
    MyOptimizer/lookahead.py @ 9d6aee57c7c7, including its detail that a parameter's slow copy is
    taken at its first synchronisation (so the first one leaves the weights unchanged). The slow
    weights live in the optimizer's per-parameter state (`slow_buffer`), so they are saved and resumed
    with it."""

    def __init__(self, params: Any, *, alpha: float = LOOKAHEAD_ALPHA, k: int = LOOKAHEAD_K, **kw: Any):
        super().__init__(params, decoupled_weight_decay=True, **kw)
        for group in self.param_groups:
            group.setdefault("lookahead_alpha", alpha)
            group.setdefault("lookahead_k", k)
            group.setdefault("lookahead_step", 0)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:
        loss = super().step(closure)
        for group in self.param_groups:
            group["lookahead_step"] += 1
            if group["lookahead_step"] % group["lookahead_k"] != 0:
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "slow_buffer" not in state:
                    state["slow_buffer"] = p.detach().clone()
                slow = state["slow_buffer"]
                slow.add_(p - slow, alpha=group["lookahead_alpha"])
                p.copy_(slow)
        return loss


def decay_groups(model: torch.nn.Module, weight_decay: float, rule: str) -> list[dict[str, Any]]:
    """Parameter groups with `weight_decay` on the parameters `rule` picks: `matrices` (weight matrices
    only, never norms, biases or the class token: models.base.param_groups), `all` (torch's default, as
    the three Adam users pass model.parameters()), `not-1d` (timm's add_weight_decay, TransMIL's: all but
    biases and 1-d parameters, its class token included)."""
    if rule == "matrices":
        return param_groups(model, weight_decay)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if rule == "all":
        everything = {"params": [p for _, p in named], "names": [n for n, _ in named]}
        return [{**everything, "weight_decay": weight_decay}]
    keep = [(n, p) for n, p in named if p.ndim <= 1 or n.endswith(".bias")]  # timm add_weight_decay
    decay = [(n, p) for n, p in named if not (p.ndim <= 1 or n.endswith(".bias"))]
    return [
        {"params": [p for _, p in keep], "names": [n for n, _ in keep], "weight_decay": 0.0},
        {"params": [p for _, p in decay], "names": [n for n, _ in decay], "weight_decay": weight_decay},
    ]


def make_optimizer(model: torch.nn.Module, task: TaskConfig) -> torch.optim.Optimizer:
    """The task's optimizer over the model's parameters: `adamw` (decoupled weight decay; our recipes),
    `adam` (weight decay added to the gradient: CLAM's, DSMIL's, DTFD-MIL's) or `lookahead-radam`
    (TransMIL's)."""
    opt = task.optimizer
    cuda = next(model.parameters()).device.type == "cuda"
    groups = decay_groups(model, float(opt.weight_decay or 0.0), opt.weight_decay_on or "matrices")
    lr = _required(opt.lr, "optimizer.lr")
    betas = (float(opt.betas[0]), float(opt.betas[1])) if opt.betas is not None else (0.9, 0.999)
    if opt.name == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=betas, fused=cuda or None)
    if opt.name == "lookahead-radam":
        return LookaheadRAdam(groups, lr=lr, betas=betas)
    # fused: one kernel for the whole update on CUDA instead of a few per parameter tensor
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=cuda or None)


def make_scheduler(
    optimizer: torch.optim.Optimizer, task: TaskConfig, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """Stepped per optimizer step: a linear warm-up over `optimizer.warmup_epochs`, then cosine decay to
    0 at `epochs` (schedule: cosine) or the peak rate (none); cosine-epochs and multistep by the
    epoch the step falls in; None for a constant rate."""
    opt = task.optimizer
    epochs = int(_required(task.epochs, "epochs"))
    if opt.schedule in ("cosine-epochs", "multistep"):
        by_epoch = _epoch_factor(task, epochs)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: by_epoch(step // max(1, steps_per_epoch))
        )
    warmup = int(opt.warmup_epochs or 0) * steps_per_epoch
    total = max(1, epochs * steps_per_epoch)
    if not warmup:
        if opt.schedule in (None, "none"):
            return None
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    cosine = opt.schedule == "cosine"

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)  # never 0: the first step already moves the weights
        if not cosine:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _epoch_factor(task: TaskConfig, epochs: int) -> Callable[[int], float]:
    """lr / peak lr during 0-based epoch e: CosineAnnealingLR(T_max=epochs, eta_min=min_lr)'s closed
    form, or MultiStepLR(milestones, gamma)'s."""
    opt = task.optimizer
    peak = _required(opt.lr, "optimizer.lr")
    if opt.schedule == "cosine-epochs":
        floor = float(opt.min_lr or 0.0)
        return lambda e: (floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * e / epochs))) / peak
    milestones, gamma = tuple(opt.milestones or ()), float(opt.gamma or 0.1)
    return lambda e: gamma ** sum(1 for m in milestones if e >= m)


def _required(value: float | int | None, name: str) -> float:
    if value is None:  # a task that skipped pipelines.train.recipe.apply_recipe
        raise ValueError(f"{name} is unset: resolve the task's recipe first (pipelines.train.recipe)")
    return float(value)


__all__ = ["LOOKAHEAD_ALPHA", "LOOKAHEAD_K", "LookaheadRAdam", "decay_groups", "make_optimizer",
           "make_scheduler"]  # fmt: skip

"""What the baselines' authors train with beside their models, written here from their repositories for
tests/models/baselines/test_mil_baselines_training.py and tests/pipelines/train/test_mil_recipes.py:

  SVM       oval-group/smooth-topk topk/svm.py, topk/functional.py, topk/utils.py @ 12c1645f187e
            (SmoothTop1SVM, CLAM's `--inst_loss svm`)
  TransMIL  szc19990412/TransMIL MyOptimizer/radam.py (RAdam), lookahead.py (Lookahead) and
            optim_factory.py (add_weight_decay) @ 9d6aee57c7c7
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
from torch import nn


# ------------------------------------------------------------------------- CLAM's SmoothTop1SVM (topk)
def ref_smooth_top1_svm(
    x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0, tau: float = 1.0
) -> torch.Tensor:
    """SmoothTop1SVM(n_classes)(x, y): detect_large (k = 1, thresh 1e3) splits the samples; the smooth
    ones get Top1_Smooth_SVM (tau log_sum_exp), the rest Top1_Hard_SVM; each part summed / x.size(0)."""
    labels = torch.arange(x.size(1))
    top, _ = x.topk(2, 1)
    hard = torch.ge(top[:, 0] - top[:, 1], 1 * tau * math.log(1e3)).detach()
    smooth = hard.eq(0)
    loss = x.new_zeros(())
    if smooth.sum():
        xs, ys = x[smooth].view(-1, x.size(1)), y[smooth]
        d = alpha * torch.ne(ys[:, None], labels[None, :]).float()
        z = (xs + d - xs.gather(1, ys[:, None])) / tau
        m, _ = z.max(1)
        loss = loss + (tau * (m + torch.log(torch.sum(torch.exp(z - m[:, None]), 1)))).sum() / x.size(0)
    if hard.sum():
        xh, yh = x[hard].view(-1, x.size(1)), y[hard]
        d = alpha * torch.ne(yh[:, None], labels[None, :]).float()
        max_, _ = (xh + d).max(1)
        loss = loss + (max_ - xh.gather(1, yh[:, None]).squeeze(1)).sum() / x.size(0)
    return loss


# ----------------------------------------------------------------- TransMIL's optimizer (MyOptimizer/)
class RefRAdam(torch.optim.Optimizer):
    """MyOptimizer/radam.py RAdam.step, in current torch's argument order."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0) -> None:  # fmt: skip
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.buffer: list[list[Any]] = [[None, None, None] for _ in range(10)]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, p32 = p.grad.float(), p.float()
                state = self.state[p]
                if len(state) == 0:
                    state["step"], state["exp_avg"] = 0, torch.zeros_like(p32)
                    state["exp_avg_sq"] = torch.zeros_like(p32)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                beta1, beta2 = group["betas"]
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                state["step"] += 1
                beta2_t = beta2 ** state["step"]
                n_sma_max = 2 / (1 - beta2) - 1
                n_sma = n_sma_max - 2 * state["step"] * beta2_t / (1 - beta2_t)
                if n_sma >= 5:
                    step_size = group["lr"] * math.sqrt(
                        (1 - beta2_t) * (n_sma - 4) / (n_sma_max - 4) * (n_sma - 2) / n_sma * n_sma_max
                        / (n_sma_max - 2)) / (1 - beta1 ** state["step"])  # fmt: skip
                else:
                    step_size = group["lr"] / (1 - beta1 ** state["step"])
                if group["weight_decay"] != 0:
                    p32.add_(p32, alpha=-group["weight_decay"] * group["lr"])
                if n_sma >= 5:
                    p32.addcdiv_(exp_avg, exp_avg_sq.sqrt().add_(group["eps"]), value=-step_size)
                else:
                    p32.add_(exp_avg, alpha=-step_size)
                p.copy_(p32)


class RefLookahead:
    """MyOptimizer/lookahead.py Lookahead(base_optimizer, alpha=0.5, k=6).step."""

    def __init__(self, base: torch.optim.Optimizer, alpha: float = 0.5, k: int = 6) -> None:
        self.base, self.param_groups = base, base.param_groups
        self.state: dict[Any, dict[str, torch.Tensor]] = defaultdict(dict)
        for group in self.param_groups:
            group.setdefault("lookahead_alpha", alpha)
            group.setdefault("lookahead_k", k)
            group.setdefault("lookahead_step", 0)

    @torch.no_grad()
    def step(self) -> None:
        self.base.step()
        for group in self.param_groups:
            group["lookahead_step"] += 1
            if group["lookahead_step"] % group["lookahead_k"] == 0:
                for fast in group["params"]:
                    if fast.grad is None:
                        continue
                    st = self.state[fast]
                    if "slow_buffer" not in st:
                        st["slow_buffer"] = fast.detach().clone()
                    slow = st["slow_buffer"]
                    slow.add_(fast - slow, alpha=group["lookahead_alpha"])
                    fast.copy_(slow)

    def zero_grad(self) -> None:
        self.base.zero_grad()


def ref_add_weight_decay(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """MyOptimizer/optim_factory.py add_weight_decay (no skip list: TransMIL defines none)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if len(param.shape) == 1 or name.endswith(".bias") else decay).append(param)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]

"""The losses of the non-categorical kinds, in torch: Cox partial likelihood and masked regression.

`cox_partial_nll` is the negative log partial likelihood of a set of bags (the risk set is every bag
of the set still followed at an event's time), with tied event times handled by Breslow's or Efron's
approximation; the tests check it against lifelines' Efron log-likelihood and a plain Breslow loop.
It is O(n^2) in memory over the n bags of the set: a few hundred to a few thousand bags.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cox_partial_nll(
    risk: torch.Tensor, time: torch.Tensor, event: torch.Tensor, *, ties: str = "efron"
) -> torch.Tensor:
    """Mean over events of -log partial likelihood; risk, time, event (n,). 0 (with a gradient of 0)
    when the set holds no event: such a set says nothing about the order of risks."""
    risk = risk.float().reshape(-1)
    time = time.float().reshape(-1)
    observed = event.reshape(-1) > 0.5
    if not bool(observed.any()):
        return risk.sum() * 0.0
    shift = risk.detach().max()  # exp(risk - shift) <= 1: no overflow
    w = torch.exp(risk - shift)  # (n,)
    at_risk = time[None, :] >= time[:, None]  # (n, n): row i = bags still followed at time_i
    s_risk = (at_risk * w[None, :]).sum(1)  # (n,)
    if ties == "breslow":
        log_denominator = torch.log(s_risk)
    elif ties == "efron":
        tied = (time[None, :] == time[:, None]) & observed[None, :]  # (n, n): events at time_i
        d = tied.sum(1).clamp(min=1)  # (n,) events tied at time_i
        s_tied = (tied * w[None, :]).sum(1)  # (n,)
        index = torch.arange(len(risk), device=risk.device)
        rank = (tied & (index[None, :] < index[:, None])).sum(1)  # (n,) 0..d-1 within the tie
        log_denominator = torch.log(s_risk - rank / d * s_tied)
    else:
        raise ValueError(f"unknown ties method {ties!r}; use efron or breslow")
    terms = (risk - shift) - log_denominator  # (n,)
    return -terms[observed].sum() / observed.sum()


def masked_regression_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    *,
    loss: str = "mse",
    huber_delta: float = 1.0,
) -> torch.Tensor:
    """sum over targets of weight * mean loss over the cases labelled for that target.

    pred, target (B, T) with NaN where a label is missing; weights (T,). Targets without a label in
    this batch add nothing."""
    mask = torch.isfinite(target)  # (B, T)
    filled = torch.where(mask, target, pred.detach())  # missing labels: no error, no gradient
    if loss == "huber":
        elementwise = F.huber_loss(pred, filled, reduction="none", delta=huber_delta)
    else:
        elementwise = (pred - filled) ** 2  # (B, T)
    counts = mask.sum(0)  # (T,)
    per_target = (elementwise * mask).sum(0) / counts.clamp(min=1)  # (T,)
    return (weights * per_target * (counts > 0)).sum()


__all__ = ["cox_partial_nll", "masked_regression_loss"]

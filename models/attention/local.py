"""Depthwise 3x3 (or 3x3x3) convolution over tokens placed by a neighbour table (see models.layout).

On a full patch grid this equals a zero-padded depthwise `nn.Conv2d` / `nn.Conv3d` without bias; on a
slide's sparse tile grid it is the same convolution with empty cells read as zero. Gathering by index
keeps the cost linear in the number of tokens whatever the grid's extent. Backward recomputes the
gathers instead of saving one (N, C) copy per tap, so memory stays at a few (N, C) tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from wsi.errors import ConfigError


def _taps(index: Tensor, t: int, batch: int, channels: int) -> tuple[Tensor, Tensor]:
    """Gather index (B, N, C) for tap t (empty cells pointed at row 0) and its validity (B, N, 1)."""
    idx = index[..., t]  # (B|1, N)
    valid = (idx >= 0).unsqueeze(-1)
    gather = idx.clamp_min(0).unsqueeze(-1).expand(batch, -1, channels)
    return gather, valid


class _Depthwise(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, u: Tensor, index: Tensor, weight: Tensor) -> Tensor:
        b, _, c = u.shape
        weight = weight.to(u.dtype)
        out = u.new_zeros(b, index.shape[1], c)
        for t in range(index.shape[-1]):
            gather, valid = _taps(index, t, b, c)
            out += u.gather(1, gather).masked_fill(~valid, 0.0) * weight[:, t]
        ctx.save_for_backward(u, index, weight)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, Tensor | None]:
        u, index, weight = ctx.saved_tensors
        b, _, c = u.shape
        grad_u = torch.zeros_like(u) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[2] else None
        for t in range(index.shape[-1]):
            gather, valid = _taps(index, t, b, c)
            g = grad.masked_fill(~valid, 0.0)  # (B, N, C) empty cells pass nothing back
            if grad_u is not None:
                grad_u.scatter_add_(1, gather, g * weight[:, t])
            if grad_w is not None:
                grad_w[:, t] = (g * u.gather(1, gather)).sum((0, 1))
        return grad_u, None, grad_w


def depthwise(u: Tensor, index: Tensor | None, weight: Tensor, centre: int) -> Tensor:
    """sum_t weight[:, t] * u[index[..., t]]: u (B, M, C), index (B|1, N, T) rows of u or -1, weight (C, T).

    `index=None` means every token is alone in its neighbourhood (only the `centre` tap reads it): N == M.
    Returns (B, N, C), no bias.
    """
    if index is None:
        return u * weight[:, centre].to(u.dtype)
    if index.shape[-1] != weight.shape[1]:
        raise ConfigError(
            f"a neighbour table of {index.shape[-1]} cells does not fit a kernel of {weight.shape[1]} taps: "
            "grid_ndim must match the grid (2 for slides and 2D images, 3 for volumes)"
        )
    out: Tensor = _Depthwise.apply(u, index, weight)
    return out


@dataclass
class LocalRows:
    """What the chunked two-pass scheme hands a local mixer for one chunk of tokens.

    `rows` (B, M, D'): the normalised block inputs of the chunk's tokens and of their grid neighbours;
    `weight` (B, M): their mask (bool or presence weight), None = all real; `index` (B, n, T): for each
    token of the chunk, the row in `rows` of each neighbourhood cell (-1: empty); `own`: where the
    chunk's own tokens sit in `rows`.
    """

    rows: Tensor
    weight: Tensor | None
    index: Tensor
    own: slice


__all__ = ["LocalRows", "depthwise"]

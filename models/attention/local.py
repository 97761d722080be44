"""Depthwise 3x3 (or 3x3x3) convolution over tokens placed by a neighbour table (see models.layout).

On a full patch grid this equals a zero-padded depthwise `nn.Conv2d` / `nn.Conv3d` without bias; on a
slide's sparse tile grid it is the same convolution with empty cells read as zero. Gathering by index
keeps the cost linear in the number of tokens whatever the grid's extent. Backward recomputes the
gathers instead of saving one (N, C) copy per tap, so memory stays at a few (N, C) tensors. An empty
cell reads an extra zero row, so no tap needs a mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from wsi.core.errors import ConfigError


def _flat_index(index: Tensor, batch: int, rows: int) -> Tensor:
    """(B|1, N, T) rows of u (-1: empty) -> (T, B * N) rows of u flattened to (B * (rows + 1), C), where
    each bag's extra last row is zero: an empty cell reads it."""
    index = index.expand(batch, -1, -1)
    flat = torch.where(index >= 0, index, rows) + (rows + 1) * torch.arange(batch, device=index.device).view(
        -1, 1, 1
    )
    return flat.flatten(0, 1).T.contiguous()  # (T, B * N)


class _Depthwise(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, u: Tensor, index: Tensor, weight: Tensor) -> Tensor:
        b, m, c = u.shape
        weight = weight.to(u.dtype)
        padded = torch.cat([u, u.new_zeros(b, 1, c)], 1).flatten(0, 1)  # (B * (M + 1), C)
        flat = _flat_index(index, b, m)
        out = u.new_zeros(b * index.shape[1], c)
        for t in range(flat.shape[0]):  # row gathers (memcpy per row), one (B * N, C) temporary
            out.addcmul_(padded.index_select(0, flat[t]), weight[:, t])
        ctx.save_for_backward(padded, flat, weight)
        ctx.shape = (b, m, c)
        return out.view(b, -1, c)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, Tensor | None]:
        padded, flat, weight = ctx.saved_tensors
        b, m, c = ctx.shape
        grad = grad.reshape(-1, c)  # (B * N, C)
        grad_u = torch.zeros_like(padded) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[2] else None
        for t in range(flat.shape[0]):
            if grad_u is not None:
                grad_u.index_add_(0, flat[t], grad * weight[:, t])
            if grad_w is not None:
                grad_w[:, t] = (grad * padded.index_select(0, flat[t])).sum(0)
        if grad_u is not None:
            grad_u = grad_u.view(b, m + 1, c)[:, :m]  # the zero rows take no gradient
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

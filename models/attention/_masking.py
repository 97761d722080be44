"""Masked reductions over the token axis: padded tokens take no part in any sum, mean or variance.

Masks are (B, N) bool, True on real tokens. Tensors reduced here are (B, N, C); results keep the token
axis as 1 so they broadcast back: (B, 1, C).
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_weights(mask: Tensor | None, x: Tensor) -> Tensor | None:
    """(B, N) bool mask -> (B, N, 1) float weights in x's dtype, or None when there is no mask."""
    if mask is None:
        return None
    return mask.to(dtype=x.dtype).unsqueeze(-1)  # (B, N, 1)


def count_tokens(mask: Tensor | None, x: Tensor) -> Tensor:
    """Number of real tokens per bag as (B, 1, 1) in x's dtype."""
    if mask is None:
        return torch.full((x.shape[0], 1, 1), float(x.shape[1]), dtype=x.dtype, device=x.device)
    return mask.sum(dim=1).to(dtype=x.dtype).view(-1, 1, 1)  # (B, 1, 1)


def masked_sum(x: Tensor, mask: Tensor | None) -> Tensor:
    """Sum over real tokens: (B, N, C) -> (B, 1, C)."""
    w = token_weights(mask, x)
    return (x if w is None else x * w).sum(dim=1, keepdim=True)


def masked_mean_var(x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Mean and (population) variance over real tokens, two-pass: (B, N, C) -> (B, 1, C) each."""
    if mask is None:  # fused, no (B, N, C) temporaries: matters for 100k-token bags
        var, mean = torch.var_mean(x, dim=1, correction=0, keepdim=True)
        return mean, var
    n = count_tokens(mask, x)  # (B, 1, 1)
    mean = masked_sum(x, mask) / n  # (B, 1, C)
    centred = x - mean
    var = masked_sum(centred * centred, mask) / n  # (B, 1, C)
    return mean, var


def zero_padded(x: Tensor, mask: Tensor | None) -> Tensor:
    """Set rows of padded tokens to 0 so they add nothing to any product over tokens."""
    if mask is None:
        return x
    return x.masked_fill(~mask.unsqueeze(-1), 0.0)

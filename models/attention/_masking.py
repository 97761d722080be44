"""Masked (and weighted) reductions over the token axis: padded tokens take no part in any sum.

A mask is (B, N): bool (True = real token) or floating, a presence weight per token (0 = padding,
1 = present, 2 = counts as two copies; `models.explain.attribution` differentiates through it). Tensors
reduced here are (B, N, C); results keep the token axis as 1 so they broadcast back: (B, 1, C). Padded rows
are zeroed (not multiplied by 0), so even non-finite padding (NaN, inf) cannot leak into a result.
"""

from __future__ import annotations

import torch
from torch import Tensor


def is_padding(mask: Tensor) -> Tensor:
    """(B, N) bool, True where a token is padding (weight 0)."""
    return ~mask if mask.dtype == torch.bool else mask == 0


def count_tokens(mask: Tensor | None, x: Tensor) -> Tensor:
    """Number of real tokens (sum of presence weights) per bag as (B, 1, 1) float32.

    float32 whatever x's dtype: bfloat16 holds integers exactly only up to 256 (12,345 -> 12,352).
    Dividing by it promotes a half-precision numerator to float32; callers cast the quotient back.
    """
    if mask is None:
        return torch.full((x.shape[0], 1, 1), float(x.shape[1]), dtype=torch.float32, device=x.device)
    return mask.sum(dim=1, dtype=torch.float32).view(-1, 1, 1)  # (B, 1, 1)


def zero_padded(x: Tensor, mask: Tensor | None) -> Tensor:
    """Set rows of padded tokens to 0 so they add nothing to any product over tokens."""
    if mask is None:
        return x
    return x.masked_fill(is_padding(mask).unsqueeze(-1), 0.0)


def weighted(x: Tensor, mask: Tensor | None) -> Tensor:
    """Rows zeroed at padding and, for a float mask, scaled by the token's presence weight.

    Apply it to ONE factor of a product summed over tokens (K in K^T V), never to both.
    """
    x = zero_padded(x, mask)
    if mask is None or mask.dtype == torch.bool:
        return x
    return x * mask.unsqueeze(-1).to(x.dtype)


def masked_sum(x: Tensor, mask: Tensor | None, dtype: torch.dtype | None = None) -> Tensor:
    """Weighted sum over real tokens: (B, N, C) -> (B, 1, C), accumulated and returned in `dtype`."""
    return weighted(x, mask).sum(dim=1, keepdim=True, dtype=dtype)


def masked_mean_var(
    x: Tensor, mask: Tensor | None, dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor]:
    """Mean and (population) variance over real tokens, two-pass: (B, N, C) -> (B, 1, C) each.

    `dtype` (default x's) is the dtype of the statistics and of their accumulation: float32 keeps them
    exact to float32 rounding for half-precision activations and sums over a million tokens.
    """
    dtype = dtype or x.dtype
    if mask is None and dtype == x.dtype:  # fused, no (B, N, C) temporaries: matters for 100k-token bags
        var, mean = torch.var_mean(x, dim=1, correction=0, keepdim=True)
        return mean, var
    n = count_tokens(mask, x)  # (B, 1, 1) float32
    mean = (masked_sum(x, mask, dtype) / n).to(dtype)  # (B, 1, C)
    centred = x.to(dtype) - mean
    var = (masked_sum(centred * centred, mask) / n).to(dtype)  # (B, 1, C)
    return mean, var

"""Masked reductions over the token axis: padded tokens take no part in any sum, mean or variance.

Masks are (B, N) bool, True on real tokens. Tensors reduced here are (B, N, C); results keep the token
axis as 1 so they broadcast back: (B, 1, C). Padded rows are zeroed (not multiplied by 0), so even
non-finite padding (NaN, inf) cannot leak into a result.
"""

from __future__ import annotations

import torch
from torch import Tensor


def count_tokens(mask: Tensor | None, x: Tensor) -> Tensor:
    """Number of real tokens per bag as (B, 1, 1) float32.

    float32 whatever x's dtype: bfloat16 holds integers exactly only up to 256 (12,345 -> 12,352).
    Dividing by it promotes a half-precision numerator to float32; callers cast the quotient back.
    """
    if mask is None:
        return torch.full((x.shape[0], 1, 1), float(x.shape[1]), dtype=torch.float32, device=x.device)
    return mask.sum(dim=1).to(dtype=torch.float32).view(-1, 1, 1)  # (B, 1, 1)


def zero_padded(x: Tensor, mask: Tensor | None) -> Tensor:
    """Set rows of padded tokens to 0 so they add nothing to any product over tokens."""
    if mask is None:
        return x
    return x.masked_fill(~mask.unsqueeze(-1), 0.0)


def masked_sum(x: Tensor, mask: Tensor | None) -> Tensor:
    """Sum over real tokens: (B, N, C) -> (B, 1, C)."""
    return zero_padded(x, mask).sum(dim=1, keepdim=True)


def masked_mean_var(x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Mean and (population) variance over real tokens, two-pass: (B, N, C) -> (B, 1, C) each, x's dtype."""
    if mask is None:  # fused, no (B, N, C) temporaries: matters for 100k-token bags
        var, mean = torch.var_mean(x, dim=1, correction=0, keepdim=True)
        return mean, var
    n = count_tokens(mask, x)  # (B, 1, 1) float32
    mean = (masked_sum(x, mask) / n).to(x.dtype)  # (B, 1, C)
    centred = x - mean
    var = (masked_sum(centred * centred, mask) / n).to(x.dtype)  # (B, 1, C)
    return mean, var

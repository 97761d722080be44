"""Exact leave-one-out logits of a MIL model: batched re-forwards with masks, and the closed form of a
softmax pooling over fixed tokens.

`tile_effects` (models.attribution) builds on these two. Re-forwarding costs N forwards of N tiles per
bag (quadratic), so it is meant for small bags; the pooled closed form is linear in N and exact for any
model whose tokens do not depend on each other before the pooling (ABMIL), and it is the exact part of
the correction used for pooled transformers on large bags.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# Tokens per batched re-forward (copies x tiles): bounds the memory of the exact leave-one-out.
REFORWARD_TOKENS = 1 << 16


@torch.no_grad()
def reforward_leave_one_out(
    model: nn.Module,
    x: Tensor,
    mask: Tensor | None,
    coords_um: Tensor | None,
    *,
    max_tokens: int = REFORWARD_TOKENS,
) -> Tensor:
    """(B, N, C): logits(bag) - logits(bag with tile i masked out), exactly, 0 at padding.

    Masking a tile out (bool mask False) is the bag without it for every kind and attention variant
    (tests/models/explain/test_attribution.py checks it against deleting the tile). Copies of a bag are
    forwarded together, `max_tokens // N` at a time.
    """
    b, n = x.shape[:2]
    base = torch.ones(b, n, dtype=torch.bool, device=x.device) if mask is None else mask
    full = model(x, base, coords_um)  # (B, C)
    effects = full.new_zeros(b, n, full.shape[-1])
    group = max(1, max_tokens // max(n, 1))
    for i in range(b):
        tiles = base[i].nonzero().flatten()
        for start in range(0, len(tiles), group):
            drop = tiles[start : start + group]
            g = len(drop)
            m = base[i].expand(g, n).clone()
            m[torch.arange(g, device=x.device), drop] = False
            coords = None if coords_um is None else coords_um[i].expand(g, -1, -1)
            without = model(x[i].expand(g, -1, -1), m, coords)  # (g, C)
            effects[i, drop] = full[i] - without
    return effects


def pooled_leave_one_out(h: Tensor, scores: Tensor, present: Tensor) -> Tensor:
    """(B, N, D): for every tile i the softmax-pooled bag vector without it, sum_{j != i} a_j h_j / sum a_j.

    h (B, N, D) tokens, scores (B, N) pooling scores, present (B, N) bool. Computed in float64 from two
    sums per bag; the sums without the top-scoring tile are re-formed shifted by the second score, so a
    pooling that puts nearly all its weight on one tile loses nothing to cancellation. A bag left empty
    pools to 0 (as `models.pooling` does).
    """
    h64, s = h.double(), scores.double().masked_fill(~present, float("-inf"))
    b, n = s.shape
    top = s.topk(min(2, n), dim=1)
    m1 = top.values[:, :1].clamp_min(torch.finfo(torch.float64).min)  # (B, 1) finite for empty bags
    e = torch.exp(s - m1)  # (B, N), 0 where absent
    e_sum, z_sum = e.sum(1, keepdim=True), torch.einsum("bn,bnd->bd", e, h64)
    e_loo = e_sum - e  # (B, N)
    z_loo = z_sum[:, None] - e[..., None] * h64  # (B, N, D)
    if n > 1:  # the top tile: sums over the others, shifted by the second score
        first = top.indices[:, 0]  # (B,)
        m2 = top.values[:, 1:2].clamp_min(torch.finfo(torch.float64).min)
        e2 = torch.exp(s - m2).scatter(1, first[:, None], 0.0)
        rows = torch.arange(b, device=s.device)
        e_loo[rows, first] = e2.sum(1)
        z_loo[rows, first] = torch.einsum("bn,bnd->bd", e2, h64)
    else:
        e_loo = torch.zeros_like(e_loo)
        z_loo = torch.zeros_like(z_loo)
    empty = e_loo <= 0
    return torch.where(
        empty[..., None], 0.0, z_loo / e_loo.clamp_min(torch.finfo(torch.float64).tiny)[..., None]
    )


__all__ = ["REFORWARD_TOKENS", "pooled_leave_one_out", "reforward_leave_one_out"]

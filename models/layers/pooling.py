"""Gated attention pooling (Ilse et al. 2018, eq. 9): one owner for ABMIL and the MIL transformer's head.

Each token h_k of a bag is scored s_k = w^T (tanh(V h_k) * sigmoid(U h_k)) (`gated`; `plain` drops the
sigmoid gate) and the bag is z = sum_k a_k h_k with a = softmax(s) over the bag's real tokens.

Why a module of its own: a class token read through linear attention sees a bag only through its
mean and covariance (seqnorm's output is an affine map of E[x] and Cov[x]), so a single positive
tile among dozens barely moves it. A per-token nonlinear score followed by a softmax over the bag can
single that tile out; this is what ABMIL does over its tile embeddings, and what `pool: gated` does
over the transformer's output tokens (models.mil).

Presence weights. Masks may be bool (True = real) or float presence weights p_k in [0, 1]; the weights
are a_k = p_k exp(s_k) / sum_j p_j exp(s_j), which is the masked softmax for 0/1 and lets
`models.attribution.tile_effects` differentiate with respect to a tile's presence (weight 0 = the bag
without the tile, with finite gradients).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class GatedAttentionPool(nn.Module):
    """Scores and convex weights of a bag's tokens; calling it returns the weighted sum and the weights.

    `dropout` acts on the attention MLP's hidden layer; `attention_dropout` (training only) leaves each
    token out of the softmax with that probability, renormalising over the rest (never a whole bag).
    """

    def __init__(
        self,
        dim: int,
        attn_dim: int,
        *,
        gated: bool = True,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.attn_v = nn.Linear(dim, attn_dim)  # tanh branch
        self.attn_u = nn.Linear(dim, attn_dim) if gated else None  # sigmoid gate
        self.attn_drop = nn.Dropout(dropout)
        # no bias: a constant added to every score cancels in the softmax (it would never learn)
        self.attn_w = nn.Linear(attn_dim, 1, bias=False)
        self.attention_dropout = float(attention_dropout)

    def scores(self, h: Tensor) -> Tensor:
        """Tokens (B, n, dim) -> scores s (B, n), at least float32 for a stable softmax."""
        hidden = torch.tanh(self.attn_v(h))  # (B, n, attn_dim)
        if self.attn_u is not None:
            hidden = hidden * torch.sigmoid(self.attn_u(h))
        s = self.attn_w(self.attn_drop(hidden)).squeeze(-1)  # (B, n)
        return s.to(torch.promote_types(s.dtype, torch.float32))

    def weights(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        """Scores (B, N) -> weights (B, N), summing to one over each bag's present tokens, 0 elsewhere.

        A bag with no present token gets all-zero weights (not NaN).
        """
        presence = None if mask is None else mask.to(scores.dtype)  # (B, N) 0/1 or presence weights
        p = self.attention_dropout
        if self.training and p > 0:
            real = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask > 0
            kept = real & (torch.rand_like(scores) >= p)  # (B, N)
            kept = torch.where(kept.any(1, keepdim=True), kept, real)  # never drop a whole bag
            presence = kept.to(scores.dtype) if presence is None else presence * kept
        if presence is None:
            return torch.softmax(scores, dim=1)
        s = scores.masked_fill(presence <= 0, float("-inf"))  # absent tokens: exp(-inf) = 0
        top = s.amax(1, keepdim=True).clamp_min(torch.finfo(s.dtype).min)  # (B, 1); finite for empty bags
        e = torch.exp(s - top) * presence  # (B, N)
        return e / e.sum(1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)

    def forward(self, h: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Tokens (B, N, dim), mask (B, N) -> (pooled z (B, dim), weights a (B, N))."""
        h = present_only(h, mask)
        a = self.weights(self.scores(h), mask)  # (B, N)
        return torch.einsum("bn,bnd->bd", a.to(h.dtype), h), a


def present_only(h: Tensor, mask: Tensor | None) -> Tensor:
    """Tokens (B, N, dim) with absent ones (mask False or presence 0) set to 0: a weight of 0 times a
    NaN in padding would still be NaN."""
    return h if mask is None else h.masked_fill((mask <= 0).unsqueeze(-1), 0.0)


__all__ = ["GatedAttentionPool", "present_only"]

"""Pieces the baselines share: input checks, the masked softmax over a bag, and the attention MLP with a
scored bias and K outputs that CLAM (Attn_Net, Attn_Net_Gated) and DTFD-MIL (Attention_Gated) use.

`models.pooling.GatedAttentionPool` (ABMIL, the transformers) has no bias on its score layer and one
score per tile; the authors' networks have both, and their parameter counts are what the tests pin.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import torch
from pydantic import Field
from torch import Tensor, nn

from wsi.core.errors import ConfigError
from wsi.models.layers.transformer import MAX_MODEL_INT

#: a width, count or chunk of a baseline's config (strict: a YAML `true` is not 1)
Width = Annotated[int, Field(gt=0, le=MAX_MODEL_INT, strict=True)]
#: a dropout rate
Rate = Annotated[float, Field(ge=0.0, lt=1.0)]

#: without gradients, bags of more tiles than this run in chunks of `AUTO_CHUNK` (exact; bounded memory)
CHUNK_ABOVE_TILES = 16384
AUTO_CHUNK = 4096


def chunk_for(n_tiles: int, asked: int | None, configured: int | None) -> int | None:
    """The chunk of a no-grad pass: the call's, the config's, else AUTO_CHUNK above CHUNK_ABOVE_TILES."""
    return asked or configured or (AUTO_CHUNK if n_tiles > CHUNK_ABOVE_TILES else None)


def check_bags(name: str, in_dim: int, x: Tensor, mask: Tensor | None) -> None:
    """ConfigError naming what is wrong with a batch of bags x (B, N, in_dim) and its bool mask (B, N)."""
    if x.ndim != 3 or x.shape[-1] != in_dim:
        raise ConfigError(
            f"{name}: bag features must be (B, N, {in_dim}), got {tuple(x.shape)}; "
            "set in_dim to the encoder's feature width"
        )
    if mask is not None and (mask.dtype != torch.bool or mask.shape != x.shape[:2]):
        raise ConfigError(
            f"{name}: mask must be bool {tuple(x.shape[:2])} (True = real tile), "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )


def bags(x: Tensor, mask: Tensor | None) -> Iterator[tuple[int, Tensor]]:
    """(index, its real tiles (n, D)) of each bag of a padded batch (models that read one bag at a time)."""
    for b in range(x.shape[0]):
        yield b, (x[b] if mask is None else x[b][mask[b]])


def chunks_of(x: Tensor, mask: Tensor | None, size: int) -> Iterator[tuple[Tensor, Tensor | None]]:
    """(x[..., sl, :], mask[..., sl]) over consecutive slices of at most `size` tiles (dim -2 of x)."""
    for start in range(0, x.shape[-2], size):
        sl = slice(start, start + size)
        yield x[..., sl, :], None if mask is None else mask[..., sl]


def masked_softmax(scores: Tensor, mask: Tensor | None, dim: int = 1) -> Tensor:
    """Softmax over a bag's real tiles along `dim` (scores (B, N, ...), mask (B, N)); 0 at padding, and
    all 0 (not NaN) for a bag without a tile. Computed in at least float32."""
    s = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if mask is None:
        return torch.softmax(s, dim=dim)
    m = mask.reshape(*mask.shape, *([1] * (s.ndim - mask.ndim)))
    s = s.masked_fill(~m, float("-inf"))
    top = s.amax(dim, keepdim=True).clamp_min(torch.finfo(s.dtype).min)
    e = torch.exp(s - top).masked_fill(~m, 0.0)
    return e / e.sum(dim, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)


class AttentionScores(nn.Module):
    """K attention scores per tile: w^T (tanh(V h) * sigmoid(U h)) + c (gated), or w^T tanh(V h) + c.

    CLAM puts dropout after each branch's nonlinearity (p = 0.25 when its dropout is on); DTFD has none.
    """

    def __init__(
        self, dim: int, attn_dim: int, n_scores: int = 1, *, gated: bool = True, dropout: float = 0.0
    ):
        super().__init__()
        self.tanh_branch = nn.Linear(dim, attn_dim)
        self.gate = nn.Linear(dim, attn_dim) if gated else None
        self.drop = nn.Dropout(dropout)
        self.score = nn.Linear(attn_dim, n_scores)

    def forward(self, h: Tensor) -> Tensor:
        """Tiles (..., n, dim) -> raw scores (..., n, K)."""
        a = self.drop(torch.tanh(self.tanh_branch(h)))
        if self.gate is not None:
            a = a * self.drop(torch.sigmoid(self.gate(h)))
        return self.score(a)


def renamed(state: dict[str, Tensor], table: dict[str, str]) -> dict[str, Tensor]:
    """A state dict with its keys' prefixes renamed by `table` (authors' prefix -> ours), longest first;
    a key no prefix matches is a ConfigError naming it (an authors' state dict of another layout)."""
    out: dict[str, Tensor] = {}
    prefixes = sorted(table, key=len, reverse=True)
    for key, value in state.items():
        match = next((p for p in prefixes if key == p or key.startswith(f"{p}.")), None)
        if match is None:
            raise ConfigError(f"unexpected key {key!r} for this model's authors' layout")
        out[table[match] + key[len(match) :]] = value
    return out


__all__ = [
    "AUTO_CHUNK", "CHUNK_ABOVE_TILES", "AttentionScores", "Rate", "Width", "bags", "check_bags", "chunk_for",
    "chunks_of", "masked_softmax", "renamed",
]  # fmt: skip

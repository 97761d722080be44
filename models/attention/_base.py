"""Shared projections and the interface every attention variant implements.

A variant only defines how tokens are mixed at the inner width D (`mix`), how one query's output splits
into per-token terms (`query_terms`), and the two-pass chunked scheme (`stream_*`). Projections map
D' -> D (Q, K, V) and D -> D' (output), so the inner width may differ from the token width.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

import torch
from einops import rearrange
from torch import Tensor, nn

from wsi.core.errors import ConfigError
from wsi.core.registry import Registry
from wsi.models.attention.layout import grid_neighbours
from wsi.models.attention.local import LocalRows
from wsi.models.attention.names import VARIANT_MODULES


class StreamState(dict[str, Tensor]):
    """A streaming pass's state: running sums and what is derived from them, by name (each variant its
    own: "n", "s1", "kv0"...); `chunks` keeps every chunk where a variant needs them all (softmax: keys,
    values and masks)."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: dict[str, list[Tensor]] = {}


class AttentionBase(nn.Module):
    """Multi-head attention skeleton: fused QKV projection, head split/merge, output projection."""

    linear: ClassVar[bool] = True  # cost linear in the number of tokens (False: quadratic, e.g. softmax)
    needs_neighbours: bool = False  # mixes grid neighbours: wants a neighbour table (per instance)
    # state-dict keys (relative to the module) that older checkpoints hold but this variant dropped
    # because they cannot change its output; loading skips them
    dead_keys: ClassVar[tuple[str, ...]] = ()
    no_weight_decay: ClassVar[frozenset[str]] = frozenset()  # parameters AdamW must not decay
    qkv_bias: ClassVar[bool] = True  # default of the `bias` option

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        inner_dim: int | None = None,
        bias: bool | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        inner = dim if inner_dim is None else int(inner_dim)
        if dim <= 0 or heads <= 0 or inner <= 0:
            raise ConfigError(f"attention needs positive dim/heads/inner_dim, got {dim}/{heads}/{inner}")
        if inner % heads:
            raise ConfigError(f"inner attention width {inner} is not divisible by heads={heads}")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"attention dropout must be in [0, 1), got {dropout}")
        self.dim, self.heads, self.inner_dim = dim, heads, inner
        self.head_dim = inner // heads
        self.to_qkv = nn.Linear(dim, 3 * inner, bias=self.qkv_bias if bias is None else bias)
        self.to_out = nn.Linear(inner, dim)  # from what `mix` returns (gdla replaces it: 2D -> D')
        self.drop = nn.Dropout(dropout)

    def _load_from_state_dict(self, state_dict: dict[str, Tensor], prefix: str, *args: Any) -> None:
        for key in self.dead_keys:  # older checkpoints: weights that cancel in this variant
            state_dict.pop(prefix + key, None)
        super()._load_from_state_dict(state_dict, prefix, *args)

    # --- helpers ---------------------------------------------------------------------------------
    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, N, D') -> three (B, N, D) tensors."""
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)  # each (B, N, D)
        return q, k, v

    def project(self, x: Tensor, part: int) -> Tensor:
        """Only Q (0), K (1) or V (2): (B, N, D') -> (B, N, D), without computing the other two."""
        rows = slice(part * self.inner_dim, (part + 1) * self.inner_dim)
        bias = None if self.to_qkv.bias is None else self.to_qkv.bias[rows]
        return nn.functional.linear(x, self.to_qkv.weight[rows], bias)

    def split(self, t: Tensor) -> Tensor:
        return rearrange(t, "b n (h d) -> b h n d", h=self.heads)

    def merge(self, t: Tensor) -> Tensor:
        return rearrange(t, "b h n d -> b n (h d)")

    @staticmethod
    def check_input(x: Tensor, mask: Tensor | None) -> None:
        if x.ndim != 3:
            raise ConfigError(f"attention input must be (B, N, dim), got shape {tuple(x.shape)}")
        if mask is not None and (
            mask.shape != x.shape[:2] or not (mask.dtype == torch.bool or mask.is_floating_point())
        ):
            raise ConfigError(
                f"mask must be a bool tensor of shape {tuple(x.shape[:2])} (True = real token) or float "
                f"presence weights, got {mask.dtype} {tuple(mask.shape)}"
            )

    def _table(
        self, x: Tensor, grid_shape: tuple[int, ...] | None, neighbours: Tensor | None
    ) -> Tensor | None:
        if neighbours is None and grid_shape is not None and self.needs_neighbours:
            return grid_neighbours(tuple(grid_shape), x.shape[1], x.device)
        return neighbours

    # --- public interface --------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        grid_shape: tuple[int, ...] | None = None,
        *,
        neighbours: Tensor | None = None,
    ) -> Tensor:
        """x (B, N, D'), mask (B, N) True = real -> (B, N, D').

        `grid_shape` says the LAST prod(grid_shape) tokens form a row-major grid; `neighbours` (B, N, T)
        gives every token's grid neighbours directly (models.attention.layout). Only mixers of neighbours use
        them.
        """
        self.check_input(x, mask)
        return self.drop(self.to_out(self.mix(x, mask, self._table(x, grid_shape, neighbours))))

    def query_contributions(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        query_index: int = 0,
        grid_shape: tuple[int, ...] | None = None,
        *,
        neighbours: Tensor | None = None,
    ) -> Tensor:
        """Per-token additive terms of the output at `query_index`: (B, N, D').

        `forward(x)[:, query_index] == terms.sum(1) + to_out.bias` exactly (without dropout).
        """
        self.check_input(x, mask)
        terms = self.query_terms(x, mask, query_index, self._table(x, grid_shape, neighbours))
        return terms @ self.to_out.weight.T  # (B, N, D')

    def stream_apply(
        self, state: StreamState, x: Tensor, mask: Tensor | None, local: LocalRows | None = None
    ) -> Tensor:
        """Second pass of chunked inference: the output for one chunk of queries, (B, n, D')."""
        return self.to_out(self.stream_mix(state, x, mask, local))

    # --- what variants implement ----------------------------------------------------------------------
    def mix(self, x: Tensor, mask: Tensor | None, neighbours: Tensor | None) -> Tensor:
        raise NotImplementedError

    def query_terms(
        self, x: Tensor, mask: Tensor | None, query_index: int, neighbours: Tensor | None
    ) -> Tensor:
        raise NotImplementedError

    def stream_begin(self) -> StreamState:
        """Start the two-pass chunked scheme; pass every chunk to `stream_collect`, then `stream_apply`."""
        return StreamState()

    def stream_collect(
        self, state: StreamState, x: Tensor, mask: Tensor | None, local: LocalRows | None = None
    ) -> None:
        raise NotImplementedError

    def stream_mix(
        self, state: StreamState, x: Tensor, mask: Tensor | None, local: LocalRows | None = None
    ) -> Tensor:
        raise NotImplementedError


def add_(state: StreamState, key: str, value: Tensor) -> None:
    """Accumulate a float64 running sum in the stream state."""
    value = value.to(torch.float64)
    state[key] = value if key not in state else state[key] + value


def no_autocast(device: torch.device) -> Any:
    """Context in which matmuls keep their inputs' dtype: summaries over N are formed in float32."""
    if not torch.amp.is_autocast_available(device.type):  # e.g. the meta device: nothing to switch off
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


# Every variant registers itself beside its class (`@ATTENTION.register("name")`); the modules of
# names.py's table are imported on the first lookup, so adding a variant is a new file plus one row there.
ATTENTION: Registry[type[AttentionBase]] = Registry(
    "attention", modules=tuple(dict.fromkeys(VARIANT_MODULES.values()))
)

"""The two-pass chunked scheme behind bounded-memory inference: exact, one chunk of activations at a time.

For each block, pass 1 feeds every chunk of (normalised) tokens to the attention's `stream_collect`,
which accumulates the bag's summaries (sums, covariances, K^T V); pass 2 computes each chunk's output
from them and runs the MLP, writing the block's output over its input in place. Linear variants then
need memory for the token buffer plus one chunk; softmax keeps K and V (still no N x N).

A mixer of grid neighbours (gdla's local path) also needs, for each chunk, the block INPUT of the
chunk's neighbours. Chunks therefore follow raster order (a chunk's neighbours are then at most one
grid row away: a small halo of rows), and a chunk's outputs are written back only once no later chunk
still needs its inputs.

The paper's gdla block (models.grid_conv) also convolves the grid before its mixer and inside its
Mix-FFN: it runs in four chunked passes with one extra (B, N, dim) buffer (`_grid_block`), each pass
reading a one-row halo of what the previous one wrote in full.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from wsi.models.attention import AttentionBase, StreamState
from wsi.models.attention.local import LocalRows


class Block(Protocol):
    """What the scheme needs of a pre-norm block (`wsi.models.layers.transformer.Block` is one): declared
    here, below the transformer, so the two modules do not know each other both ways."""

    @property
    def attn(self) -> AttentionBase: ...
    @property
    def norm1(self) -> Callable[[Tensor], Tensor]: ...
    @property
    def norm2(self) -> Callable[[Tensor], Tensor]: ...
    @property
    def mlp(self) -> Any: ...  # MLP, or MixFFN (hidden + mix) when `pre` is set
    @property
    def pre(self) -> Any: ...  # SiLU(DWC3x3) before the mixer (models.grid_conv.PreMix) or None
    def attend(self, t: Tensor) -> Tensor: ...


def chunk_slices(n: int, size: int) -> Iterator[slice]:
    """Consecutive slices of at most `size` covering range(n): the chunks of the two-pass scheme."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


class _Rows:
    """Reads and writes rows of the token buffer x (B, N, dim) by position in the processing order."""

    def __init__(self, x: Tensor, order: Tensor | None) -> None:
        self.x, self.order = x, order

    def read(self, sl: slice) -> Tensor:
        if self.order is None:
            return self.x[:, sl]
        idx = self.order[:, sl].unsqueeze(-1).expand(-1, -1, self.x.shape[-1])
        return self.x.gather(1, idx)  # (B, n, dim) copy

    def write(self, sl: slice, y: Tensor) -> None:
        if self.order is None:
            self.x[:, sl] = y
        else:
            self.x.scatter_(1, self.order[:, sl].unsqueeze(-1).expand_as(y), y)


def _halo(neighbours: Tensor, sl: slice) -> slice:
    """The positions a chunk reads: its own and those of its tokens' grid neighbours."""
    nb = neighbours[:, sl]
    valid = nb[nb >= 0]
    lo = min(sl.start, int(valid.min())) if valid.numel() else sl.start
    hi = max(sl.stop, int(valid.max()) + 1) if valid.numel() else sl.stop
    return slice(lo, hi)


def _local(read: Callable[[slice], Tensor], mask: Tensor | None, neighbours: Tensor, sl: slice) -> LocalRows:
    """The rows a chunk reads (`read` of its halo: its own and its grid neighbours') and their index."""
    halo = _halo(neighbours, sl)
    nb = neighbours[:, sl]
    index = torch.where(nb >= 0, nb - halo.start, -1)  # rows of the halo
    weight = None if mask is None else mask[:, halo]
    own = slice(sl.start - halo.start, sl.stop - halo.start)
    return LocalRows(read(halo), weight, index, own)


def _collect(
    blk: Block,
    read: Callable[[slice], Tensor],
    mask: Tensor | None,
    table: Tensor | None,
    slices: list[slice],
) -> StreamState:
    """Pass 1: the attention's summaries over the attention inputs `read` gives."""
    state = blk.attn.stream_begin()
    for sl in slices:
        m = None if mask is None else mask[:, sl]
        if table is None:
            blk.attn.stream_collect(state, read(sl), m)
        else:
            local = _local(read, mask, table, sl)
            blk.attn.stream_collect(state, local.rows[:, local.own], m, local)
    return state


def _attend(
    blk: Block,
    state: StreamState,
    read: Callable[[slice], Tensor],
    mask: Tensor | None,
    table: Tensor | None,
    sl: slice,
) -> Tensor:
    """Pass 2 for one chunk: the attention's output (B, n, dim) as it enters the residual."""
    m = None if mask is None else mask[:, sl]
    if table is None:
        return blk.attend(blk.attn.stream_apply(state, read(sl), m))
    local = _local(read, mask, table, sl)
    return blk.attend(blk.attn.stream_apply(state, local.rows[:, local.own], m, local))


def _plain_block(
    blk: Block, rows: _Rows, mask: Tensor | None, neighbours: Tensor | None, slices: list[slice]
) -> None:
    """x + Attn(LN(x)), then + MLP(LN(.)), a chunk's output written once no later chunk reads its rows."""
    table = neighbours if blk.attn.needs_neighbours else None
    n = rows.x.shape[1]

    def read(sl: slice) -> Tensor:
        return blk.norm1(rows.read(sl))

    state = _collect(blk, read, mask, table, slices)
    later_low = [n] * len(slices)  # lowest position any chunk after i reads
    for i in range(len(slices) - 2, -1, -1):
        nxt = slices[i + 1]
        low = nxt.start if table is None else _halo(table, nxt).start
        later_low[i] = min(later_low[i + 1], low)
    pending: deque[tuple[slice, Tensor]] = deque()
    for i, sl in enumerate(slices):
        y = rows.read(sl) + _attend(blk, state, read, mask, table, sl)
        pending.append((sl, y + blk.mlp(blk.norm2(y))))
        while pending and pending[0][0].stop <= later_low[i]:
            rows.write(*pending.popleft())
    while pending:
        rows.write(*pending.popleft())


def _grid_block(
    blk: Block, rows: _Rows, mask: Tensor | None, neighbours: Tensor | None, slices: list[slice]
) -> None:
    """The paper's gdla block (models.grid_conv), in four chunked passes over one extra (B, N, dim)
    buffer: A = SiLU(DWC(LN(x))) for every token (a halo of x), the attention's summaries over A,
    x + Attn(A) written over x (later chunks read only A), then y + MixFFN(LN(y)) (a halo of y) into
    the buffer, copied back at the end."""
    assert blk.pre is not None
    extra = _Rows(torch.empty_like(rows.x), rows.order)
    for sl in slices:  # 1: the attention's input
        if neighbours is None:
            extra.write(sl, blk.pre(blk.norm1(rows.read(sl)), None if mask is None else mask[:, sl], None))
        else:
            local = _local(lambda h: blk.norm1(rows.read(h)), mask, neighbours, sl)
            extra.write(sl, blk.pre(local.rows, local.weight, local.index))
    table = neighbours if blk.attn.needs_neighbours else None
    state = _collect(blk, extra.read, mask, table, slices)  # 2
    for sl in slices:  # 3
        rows.write(sl, rows.read(sl) + _attend(blk, state, extra.read, mask, table, sl))
    del state
    for sl in slices:  # 4: Mix-FFN over a halo of y; A is no longer needed, its buffer takes the output
        m = None if mask is None else mask[:, sl]
        y = rows.read(sl)
        if neighbours is None:
            extra.write(sl, y + blk.mlp.mix(blk.mlp.hidden(blk.norm2(y)), m, None))
        else:
            local = _local(lambda h: blk.mlp.hidden(blk.norm2(rows.read(h))), mask, neighbours, sl)
            extra.write(sl, y + blk.mlp.mix(local.rows, local.weight, local.index))
    rows.x.copy_(extra.x)


def run_chunked(
    blocks: Sequence[Block],
    x: Tensor,
    mask: Tensor | None,
    chunk: int,
    neighbours: Tensor | None,
    order: Tensor | None,
) -> Tensor:
    """Overwrite x (B, N, dim) with the blocks' output; mask and neighbours are in `order`'s positions."""
    rows = _Rows(x, order)
    if mask is not None and order is not None:
        mask = mask.gather(1, order)  # (B, N) in processing order
    slices = list(chunk_slices(x.shape[1], chunk))
    for blk in blocks:
        if blk.pre is None:
            _plain_block(blk, rows, mask, neighbours, slices)
        else:
            _grid_block(blk, rows, mask, neighbours, slices)
    return x


__all__ = ["chunk_slices", "run_chunked"]

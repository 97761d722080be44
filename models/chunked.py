"""The two-pass chunked scheme behind bounded-memory inference: exact, one chunk of activations at a time.

For each block, pass 1 feeds every chunk of (normalised) tokens to the attention's `stream_collect`,
which accumulates the bag's summaries (sums, covariances, K^T V); pass 2 computes each chunk's output
from them and runs the MLP, writing the block's output over its input in place. Linear variants then
need memory for the token buffer plus one chunk; softmax keeps K and V (still no N x N).

A mixer of grid neighbours (gdla's local path) also needs, for each chunk, the block INPUT of the
chunk's neighbours. Chunks therefore follow raster order (a chunk's neighbours are then at most one
grid row away: a small halo of rows), and a chunk's outputs are written back only once no later chunk
still needs its inputs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch
from torch import Tensor

from wsi.models.attention import AttentionBase
from wsi.models.attention.local import LocalRows


class Block(Protocol):
    """What the scheme needs of a pre-norm block (`wsi.models.transformer.Block` is one): declared here,
    below the transformer, so the two modules do not know each other both ways."""

    @property
    def attn(self) -> AttentionBase: ...
    @property
    def norm1(self) -> Callable[[Tensor], Tensor]: ...
    @property
    def norm2(self) -> Callable[[Tensor], Tensor]: ...
    @property
    def mlp(self) -> Callable[[Tensor], Tensor]: ...
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


def _local(blk: Block, rows: _Rows, mask: Tensor | None, neighbours: Tensor, sl: slice) -> LocalRows:
    halo = _halo(neighbours, sl)
    nb = neighbours[:, sl]
    index = torch.where(nb >= 0, nb - halo.start, -1)  # rows of the halo
    weight = None if mask is None else mask[:, halo]
    own = slice(sl.start - halo.start, sl.stop - halo.start)
    return LocalRows(blk.norm1(rows.read(halo)), weight, index, own)


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
        table = neighbours if blk.attn.needs_neighbours else None
        state = blk.attn.stream_begin()
        for sl in slices:
            m = None if mask is None else mask[:, sl]
            if table is None:
                blk.attn.stream_collect(state, blk.norm1(rows.read(sl)), m)
            else:
                local = _local(blk, rows, mask, table, sl)
                blk.attn.stream_collect(state, local.rows[:, local.own], m, local)
        # pass 2: a chunk's output waits until no later chunk reads its rows as neighbours
        later_low = [x.shape[1]] * len(slices)  # lowest position any chunk after i reads
        for i in range(len(slices) - 2, -1, -1):
            nxt = slices[i + 1]
            low = nxt.start if table is None else _halo(table, nxt).start
            later_low[i] = min(later_low[i + 1], low)
        pending: deque[tuple[slice, Tensor]] = deque()
        for i, sl in enumerate(slices):
            m = None if mask is None else mask[:, sl]
            xc = rows.read(sl)
            if table is None:
                y = xc + blk.attend(blk.attn.stream_apply(state, blk.norm1(xc), m))
            else:
                local = _local(blk, rows, mask, table, sl)
                y = xc + blk.attend(blk.attn.stream_apply(state, local.rows[:, local.own], m, local))
            pending.append((sl, y + blk.mlp(blk.norm2(y))))
            while pending and pending[0][0].stop <= later_low[i]:
                rows.write(*pending.popleft())
        while pending:
            rows.write(*pending.popleft())
        del state
    return x


__all__ = ["chunk_slices", "run_chunked"]

"""The compressed JPEG tiles of one batch: each touched once, read in a few large reads, completed in place.

Why: a reader worker's whole job on the device path is to move the bytes of the file's JPEG tiles into
one buffer per batch. Reading them one `os.pread` per tile (a syscall and a bytes object each), completing
each with bytes concatenation and joining them cost more than the reading itself
(benchmarks/embed_feed.py). Here the JPEG grid cells a batch touches are found with array operations,
each cell once however many output tiles lie over it, sorted by file offset and read with one
`os.preadv` per run of neighbouring cells (gaps of up to MAX_GAP bytes are read into a scratch buffer and
dropped) straight into their place in the batch buffer. Each tile lands HEAD - 2 bytes after its
stream's start, so its own SOI marker lies where the last two bytes of the stream header go; writing the
header over it leaves `jpeg.complete_jpeg(tile, tables, rgb)` byte for byte (tests/test_embed_feed.py).

Public API:
  cell_table(win, level) -> (grid0 (B,2), table (B,GH,GW), cells (J,2))    each touched cell once
  cell_keys(win, level) -> (grid0, keys (B,GH,GW));  table_of_keys(keys, n_cols) -> (table, cells)
  stream_header(tables, rgb) -> bytes     what complete_jpeg puts before a tile's body
  batch_buffer(n) -> Tensor               (n,) uint8; in shared memory inside a DataLoader reader process
  Streams(data, offsets, lengths, missing)
  read_streams(fd, offsets, counts, header, rgb, scratch) -> Streams
"""

from __future__ import annotations

import os
from collections import deque
from itertools import pairwise, repeat
from typing import NamedTuple, Protocol

import numpy as np
import torch
from torch.utils.data import get_worker_info

from wsi.pipelines.embed.device_decode.jpeg import SOI, complete_jpeg


class JpegLevel(Protocol):
    """What the cell arithmetic needs of raw_tiles.JpegLevel (a protocol: raw_tiles imports this module)."""

    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def tile_w(self) -> int: ...
    @property
    def tile_h(self) -> int: ...
    @property
    def n_cols(self) -> int: ...

#: bytes between two cells' data that are still read in one call (and dropped): a syscall costs about
#: as much as copying 16-32 kB, and a level's tiles are mostly stored back to back in row order
MAX_GAP = 32 * 1024
#: cells per `os.preadv` call: two iovecs each (gap, data) under the kernel's IOV_MAX of 1024
MAX_CELLS_PER_READ = 500
_APP0, _JFIF = (0xFF, 0xE0), np.frombuffer(b"JFIF\x00", np.uint8)


class Streams(NamedTuple):
    """The complete JPEG streams of one batch's cells, in cell (slot) order, inside one buffer."""

    data: torch.Tensor  # (total,) uint8
    offsets: np.ndarray  # (J,) int64 start of each stream in data
    lengths: np.ndarray  # (J,) int64 bytes of each stream; 0: unusable (missing, short, not a JPEG)
    missing: np.ndarray  # (J,) bool: the file holds no data for this cell (sparse TIFF: white, not bad)


def cell_keys(win: np.ndarray, lv: JpegLevel) -> tuple[np.ndarray, np.ndarray]:
    """Each window's JPEG grid cells: grid0 (B, 2) first cell (gx0, gy0) and keys (B, GH, GW) int64
    row * n_cols + col of every touched cell (clipped to the level), -1 where none. A reader makes
    them once per slide; a batch then only slices them (table_of_keys)."""
    tw, th = lv.tile_w, lv.tile_h
    x0c, y0c = np.maximum(win[:, 0], 0), np.maximum(win[:, 1], 0)
    x1c = np.minimum(win[:, 0] + win[:, 2], lv.width)
    y1c = np.minimum(win[:, 1] + win[:, 3], lv.height)
    inside = (x1c > x0c) & (y1c > y0c)
    gx0, gy0 = x0c // tw, y0c // th
    gw = np.where(inside, (x1c - 1) // tw - gx0 + 1, 0)[:, None, None]
    gh = np.where(inside, (y1c - 1) // th - gy0 + 1, 0)[:, None, None]
    r = np.arange(max(1, int(gh.max(initial=0))))[:, None]
    c = np.arange(max(1, int(gw.max(initial=0))))[None, :]
    keys = (gy0[:, None, None] + r) * lv.n_cols + (gx0[:, None, None] + c)
    keys[(r >= gh) | (c >= gw)] = -1
    return np.stack([gx0, gy0], axis=1).astype(np.int64), keys.astype(np.int64)


def table_of_keys(keys: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """table (B, GH, GW) slot of each touched cell (-1: none) and cells (J, 2) (col, row) of each slot,
    slots in row-major cell order (a TIFF's tile order, so mostly the file's).

    Distinct cells by marking them in an array over the batch's key range (a batch covers a band of
    rows), not by sorting: twice as fast as np.unique here, and this runs once per batch.
    """
    flat = keys.reshape(-1)
    touched = flat >= 0
    if not touched.any():
        return np.full(keys.shape, -1, np.int64), np.zeros((0, 2), np.int64)
    lo = int(flat[touched].min())
    at = np.where(touched, flat - lo, 0)
    seen = np.zeros(int(flat.max()) - lo + 1, bool)
    seen[at[touched]] = True
    uniq = np.flatnonzero(seen)
    slot = np.empty(len(seen), np.int64)
    slot[uniq] = np.arange(len(uniq))
    table = np.where(touched, slot[at], -1).reshape(keys.shape)
    uniq += lo
    cells = np.empty((len(uniq), 2), np.int64)
    cells[:, 0], cells[:, 1] = uniq % n_cols, uniq // n_cols
    return table, cells


def cell_table(win: np.ndarray, lv: JpegLevel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The JPEG grid cells each window touches (clipped to the level), deduplicated over the batch.

    Returns grid0 (B, 2) first cell (gx0, gy0) of each window, table (B, GH, GW) slot of each touched
    cell (-1: none) and cells (J, 2) (col, row) of each slot, in row-major order.
    """
    grid0, keys = cell_keys(win, lv)
    return (grid0, *table_of_keys(keys, lv.n_cols))


def stream_header(tables: bytes | None, rgb: bool) -> bytes:
    """The bytes `complete_jpeg` puts before a tile's body (the tile's SOI is replaced by them)."""
    return complete_jpeg(SOI, tables, rgb)


def batch_buffer(n: int) -> torch.Tensor:
    """(n,) uint8 for one batch's streams. In a DataLoader reader process it is allocated in shared
    memory, as torch's default_collate does, so sending the batch to the main process copies nothing.

    Why not one buffer reused for every batch: the batch leaves this process (shared memory) and the
    consumer holds several batches at once (prefetch, decode-ahead), so a reused buffer would be
    overwritten under it. What is reused is the scratch buffer of the gaps; pinning (on CUDA) is done
    by the main process into torch's caching host allocator, which reuses its pinned blocks.
    """
    if get_worker_info() is not None and n > 0:
        return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(n))
    return torch.empty(n, dtype=torch.uint8)


def read_streams(
    fd: int, offsets: np.ndarray, counts: np.ndarray, header: bytes, rgb: bool, scratch: memoryview
) -> Streams:
    """The complete JPEG streams of cells at file `offsets` (`counts` bytes each), in the given order.

    As `complete_jpeg(os.pread(fd, count, offset), tables, rgb)` per cell (header = stream_header): a
    cell the file does not hold (offset or count 0) is `missing`; one of at most 2 bytes, cut short by the
    end of the file or not starting with SOI gets length 0. scratch: at least MAX_GAP bytes, reused.

    Tiles that are complete streams already (no JPEGTables, not RGB: header is SOI alone) are read in
    the file's own layout, one buffer per run of neighbours (gaps included): no work per tile at all.
    Others get HEAD - 2 bytes of room before each tile for the header.
    """
    offsets, counts = np.asarray(offsets, np.int64), np.asarray(counts, np.int64)
    missing = (counts == 0) | (offsets == 0)
    wanted = np.flatnonzero(~missing & (counts > 2))
    order = wanted[np.argsort(offsets[wanted], kind="stable")]  # file order
    off, cnt = offsets[order], counts[order]
    gap = np.zeros(len(order), np.int64)
    gap[1:] = off[1:] - off[:-1] - cnt[:-1]
    first = (gap < 0) | (gap > MAX_GAP)  # a cell that starts a new read
    first[:1] = True
    n_head = len(header)
    whole = header == SOI
    if whole:  # the file's layout: each run's bytes, gaps included, back to back
        run = np.cumsum(first) - 1
        run_start = off[first]
        run_len = np.maximum.reduceat(off + cnt, np.flatnonzero(first)) - run_start if len(off) else off
        run_dst = np.concatenate([[0], np.cumsum(run_len)])
        dst = run_dst[run] + off - run_start[run]
        total = int(run_dst[-1])
    else:  # in file order, with room for the header before each tile
        size = cnt + (n_head - 2)
        dst = np.concatenate([[0], np.cumsum(size)]) + (n_head - 2)
        total = int(dst[-1]) - (n_head - 2)
        dst = dst[:-1]
    data = batch_buffer(total)
    buf = data.numpy()
    full = _read(fd, off, cnt, dst, gap, first, whole, buf, scratch)
    at = np.where(full, dst, 0)  # where each tile read whole starts (0: not read, never looked at)
    if len(at) and len(buf):
        full &= (buf[at] == SOI[0]) & (buf[at + 1] == SOI[1])
    skip = _jfif_skip(buf, at, cnt, full) if rgb else 0
    starts = dst - (n_head - 2) + skip
    lengths_in_order = np.where(full, n_head + cnt - 2 - skip, 0)
    if not whole:  # the header over each tile's SOI (and a dropped JFIF segment); map: no Python loop
        at_ok = starts[full].tolist()
        ends = (starts[full] + n_head).tolist()
        deque(map(buf.data.__setitem__, map(slice, at_ok, ends), repeat(header, len(at_ok))), 0)
    out_starts, lengths = np.zeros(len(counts), np.int64), np.zeros(len(counts), np.int64)
    out_starts[order] = np.where(full, starts, 0)
    lengths[order] = lengths_in_order
    return Streams(data, out_starts, lengths, missing)


def _jfif_skip(buf: np.ndarray, at: np.ndarray, counts: np.ndarray, ok: np.ndarray) -> np.ndarray | int:
    """Bytes of a JFIF APP0 segment right after each tile's SOI, which complete_jpeg drops from RGB
    tiles (JFIF would make decoders take them for YCbCr); 0 where there is none (0 alone: none at all)."""
    can = ok & (counts >= 11)  # SOI, APP0 marker, length, "JFIF\0": shorter bodies never match
    if not can.any():
        return 0
    can &= buf[np.where(can, at + 3, 0)] == _APP0[1]  # most tiles have no APP0: one look settles them
    if not can.any():
        return 0
    skip = np.zeros(len(counts), np.int64)
    a = at[can]
    ident = buf[a[:, None] + np.arange(6, 11)]  # (n, 5)
    jfif = (buf[a + 2] == _APP0[0]) & (ident == _JFIF).all(axis=1)
    seg = 2 + (buf[a + 4].astype(np.int64) << 8) + buf[a + 5]  # marker + its length field's value
    skip[can] = np.where(jfif, np.minimum(seg, counts[can] - 2), 0)  # complete_jpeg's slice clips too
    return skip


def _read(
    fd: int, off: np.ndarray, cnt: np.ndarray, dst: np.ndarray, gap: np.ndarray, first: np.ndarray,
    whole: bool, buf: np.ndarray, scratch: memoryview,
) -> np.ndarray:  # fmt: skip
    """Read cell i (file order) into buf[dst[i] : dst[i] + cnt[i]], a run of neighbours per os.preadv
    (whole: the run's bytes in one piece); (J,) bool: read whole (False: the file ended first)."""
    full = np.zeros(len(off), bool)
    if not len(off):
        return full
    view = buf.data
    starts = [*np.flatnonzero(first).tolist(), len(off)]
    end = off + cnt
    if whole:
        for a, z in pairwise(starts):
            t, o = int(dst[a]), int(off[a])
            n = os.preadv(fd, [view[t : t + int(end[z - 1]) - o]], o)  # ends rise within a run
            full[a:z] = end[a:z] - o <= n
    else:
        g, t, e = gap.tolist(), dst.tolist(), (dst + cnt).tolist()
        for a, z in pairwise(starts):
            for a0 in range(a, z, MAX_CELLS_PER_READ):
                z0 = min(z, a0 + MAX_CELLS_PER_READ)
                if not any(g[a0 + 1 : z0]):  # tiles back to back in the file (Aperio): map, no loop
                    parts = list(map(view.__getitem__, map(slice, t[a0:z0], e[a0:z0])))
                else:
                    parts = [view[t[a0] : e[a0]]]
                    for i in range(a0 + 1, z0):
                        if g[i]:
                            parts.append(scratch[: g[i]])
                        parts.append(view[t[i] : e[i]])
                n = os.preadv(fd, parts, int(off[a0]))
                full[a0:z0] = end[a0:z0] - off[a0] <= n
    for i in np.flatnonzero(~full).tolist():  # cut short (end of file): each alone, as a pread would
        t0 = int(dst[i])
        full[i] = os.preadv(fd, [view[t0 : t0 + int(cnt[i])]], int(off[i])) == cnt[i]
    return full

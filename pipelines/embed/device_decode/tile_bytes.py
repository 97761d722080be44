"""The compressed JPEG tiles of one batch: each touched once, read in a few large reads, completed in place.

Why: a reader worker's whole job on the device path is to move the bytes of the file's JPEG tiles into
one buffer per batch. Reading them one `os.pread` per tile (a syscall and a bytes object each), completing
each with bytes concatenation and joining them cost more than the reading itself
(benchmarks/embed_feed.py). Here the JPEG grid cells a batch touches are found with array operations,
each cell once however many output tiles lie over it, sorted by file offset and read with one
`preadv` per run of neighbouring cells (gaps of up to MAX_GAP bytes are read into a scratch buffer and
dropped) straight into their place in the batch buffer, the iovec array built by numpy (iovec.py: no
memoryview per tile). Each tile lands HEAD - 2 bytes after its stream's start, so its own SOI marker
lies where the last two bytes of the stream header go; writing the header over it leaves
`jpeg.complete_jpeg(tile, tables, rgb)` byte for byte (tests/pipelines/embed/test_embed_feed.py). The headers
of all tiles are written in one numpy assignment through a view whose rows start at every byte.

Public API:
  cell_table(win, level) -> (grid0 (B,2), table (B,GH,GW), cells (J,2))    each touched cell once
  cell_keys(win, level) -> (grid0, keys (B,GH,GW));  table_of_keys(keys, n_cols) -> (table, cells, keys)
  stream_header(tables, rgb) -> bytes     what complete_jpeg puts before a tile's body
  batch_buffer(n) -> Tensor               (n,) uint8; in shared memory inside a DataLoader reader process
  Streams(data, offsets, lengths, missing)
  read_streams(fd, offsets, counts, header, rgb, scratch) -> Streams
"""

from __future__ import annotations

import os
from itertools import pairwise
from typing import NamedTuple, Protocol

import numpy as np
import torch
from numpy.typing import DTypeLike
from torch.utils.data import get_worker_info

from wsi.pipelines.embed.device_decode.iovec import IOV_MAX, address, iovecs, preadv
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
#: segments per preadv call (a cell, or the gap bytes before it): the kernel's IOV_MAX
MAX_SEGMENTS_PER_READ = min(IOV_MAX, 1024)
#: SOI as the little-endian integer _view gathers
_SOI16 = int.from_bytes(SOI, "little")
#: the first 11 bytes of a tile with a JFIF segment, and which of them say so (APP0 marker, "JFIF\0")
_JFIF_HEAD = np.frombuffer(SOI + b"\xff\xe0\x00\x00JFIF\x00", np.uint8)
_JFIF_MASK = np.frombuffer(b"\x00\x00\xff\xff\x00\x00\xff\xff\xff\xff\xff", np.uint8)


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


def table_of_keys(keys: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """table (B, GH, GW) slot of each touched cell (-1: none), cells (J, 2) (col, row) and keys (J,) of
    each slot, slots in row-major cell order (a TIFF's tile order, so mostly the file's).

    Distinct cells by marking them in an array over the batch's key range (a batch covers a band of
    rows), not by sorting: twice as fast as np.unique here, and this runs once per batch. Index 0 of
    the marks stands for "no cell" (key -1), so no step needs a mask of the touched entries.
    """
    flat = keys.reshape(-1)
    hi = int(flat.max(initial=-1))
    if hi < 0:
        return np.full(keys.shape, -1, np.int64), np.zeros((0, 2), np.int64), np.zeros(0, np.int64)
    lo = int(np.where(flat >= 0, flat, hi).min()) - 1  # the key before the first: mark 0
    at = np.maximum(flat - lo, 0)
    seen = np.zeros(hi - lo + 1, bool)
    seen[at] = True
    seen[0] = False
    uniq = np.flatnonzero(seen)
    slot = np.empty(len(seen), np.int64)
    slot[0], slot[uniq] = -1, np.arange(len(uniq))
    table = slot[at].reshape(keys.shape)
    uniq += lo
    cells = np.empty((len(uniq), 2), np.int64)
    cells[:, 1], cells[:, 0] = np.divmod(uniq, n_cols)
    return table, cells, uniq


def cell_table(win: np.ndarray, lv: JpegLevel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The JPEG grid cells each window touches (clipped to the level), deduplicated over the batch.

    Returns grid0 (B, 2) first cell (gx0, gy0) of each window, table (B, GH, GW) slot of each touched
    cell (-1: none) and cells (J, 2) (col, row) of each slot, in row-major order.
    """
    grid0, keys = cell_keys(win, lv)
    table, cells, _ = table_of_keys(keys, lv.n_cols)
    return grid0, table, cells


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
    the file's own layout, one segment per run of neighbours (gaps included): no work per tile at all.
    Others get HEAD - 2 bytes of room before each tile for the header, which is then written over every
    tile at once. Every step is one numpy operation over the batch (none runs per tile; only cells a
    truncated file cuts short are read again one by one), and the common case (every cell held, tiles
    in file order) takes the fewest: a batch's fixed cost is what is left between this and a plain
    pread loop (benchmarks/embed_feed.py).
    """
    offsets, counts = np.asarray(offsets, np.int64), np.asarray(counts, np.int64)
    missing = np.zeros(len(counts), bool)
    order = None  # which cell each read one is (None: all, as given)
    if len(counts) and (counts.min() <= 2 or not offsets.all()):  # not held or too short: no stream
        missing = (counts == 0) | (offsets == 0)
        order = np.flatnonzero((counts > 2) & ~missing)
    off, cnt = (offsets, counts) if order is None else (offsets[order], counts[order])
    if not len(off):
        return Streams(
            batch_buffer(0), np.zeros(len(counts), np.int64), np.zeros(len(counts), np.int64), missing
        )
    end = off + cnt
    gap = off[1:] - end[:-1]  # bytes between a cell and the one before it
    if (gap < 0).any():  # not in file order (row-major cells mostly are): sorted, neighbours read together
        by_offset = np.argsort(off, kind="stable")
        order = by_offset if order is None else order[by_offset]
        off, cnt = off[by_offset], cnt[by_offset]
        end = off + cnt
        gap = off[1:] - end[:-1]  # < 0 now only where cells share bytes: each starts a read
    runs = np.zeros(1, np.int64)  # first cell of each read: all in one when the tiles are back to back
    if gap.any():
        runs = np.flatnonzero(np.concatenate([[True], (gap < 0) | (gap > MAX_GAP)]))
    n_head = len(header)
    whole = header == SOI
    if whole:  # the file's layout: each run's bytes, gaps included, back to back
        run_len = np.maximum.reduceat(end, runs) - off[runs]
        run_dst = np.cumsum(run_len) - run_len
        dst = off - off[0] if len(runs) == 1 else off + (run_dst - off[runs])[_run_of(runs, len(off))]
        total = int(run_dst[-1] + run_len[-1])
    else:  # in file order, with room for the header before each tile
        slot_end = np.cumsum(cnt + (n_head - 2))
        dst = slot_end - cnt
        total = int(slot_end[-1])
    data = batch_buffer(total)
    buf = data.numpy()
    full = _read(fd, off, end, dst, runs, gap, whole, buf, data.data_ptr(), scratch)
    at = dst if full is None else np.where(full, dst, 0)  # None: all read whole; 0: not read, not looked at
    ok = _view(buf, "<u2")[at] == _SOI16
    if full is not None:
        ok &= full
    every = bool(ok.all())
    skip = _jfif_skip(buf, at, cnt, ok) if rgb else 0
    starts, length = dst - (n_head - 2) + skip, cnt + (n_head - 2) - skip
    if not whole:  # the header over each tile's SOI (and a dropped JFIF segment)
        _view(buf, np.uint8, n_head)[starts if every else starts[ok]] = np.frombuffer(header, np.uint8)
    if not every:
        starts, length = np.where(ok, starts, 0), np.where(ok, length, 0)
    if order is None:
        return Streams(data, starts, length, missing)
    out_starts, lengths = np.zeros(len(counts), np.int64), np.zeros(len(counts), np.int64)
    out_starts[order], lengths[order] = starts, length
    return Streams(data, out_starts, lengths, missing)


def _view(buf: np.ndarray, dtype: DTypeLike, width: int = 0) -> np.ndarray:
    """A view of buf with an element (width 0) or a row of `width` elements at every byte: gathering
    from it reads (or writes) a few bytes at each of many offsets in one numpy operation."""
    dt = np.dtype(dtype)
    span = dt.itemsize * max(width, 1)
    n = max(0, len(buf) - span + 1)
    if width:
        return np.ndarray((n, width), dt, buffer=buf, strides=(1, dt.itemsize))
    return np.ndarray((n,), dt, buffer=buf, strides=(1,))


def _jfif_skip(buf: np.ndarray, at: np.ndarray, counts: np.ndarray, ok: np.ndarray) -> np.ndarray | int:
    """Bytes of a JFIF APP0 segment right after each tile's SOI, which complete_jpeg drops from RGB
    tiles (JFIF would make decoders take them for YCbCr); 0 where there is none (0 alone: none at all)."""
    can = ok & (counts >= 11)  # SOI, APP0 marker, length, "JFIF\0": shorter bodies never match
    every = bool(can.all())
    a, n = (at, counts) if every else (at[can], counts[can])
    head = _view(buf, np.uint8, 11)[a]  # (m, 11) each tile's first bytes: one gather
    jfif = ~((head ^ _JFIF_HEAD) & _JFIF_MASK).any(axis=1)
    if not jfif.any():  # Aperio's tiles have no APP0 segment
        return 0
    seg = 2 + head[:, 4].astype(np.int64) * 256 + head[:, 5]  # marker + its length field's value
    got = np.where(jfif, np.minimum(seg, n - 2), 0)  # complete_jpeg's slice clips too
    if every:
        return got
    skip = np.zeros(len(counts), np.int64)
    skip[can] = got
    return skip


def _run_of(runs: np.ndarray, n: int) -> np.ndarray:
    """(n,) the run each of n cells belongs to, runs: the first cell of each."""
    return np.searchsorted(runs, np.arange(n), side="right") - 1


def _read(
    fd: int, off: np.ndarray, end: np.ndarray, dst: np.ndarray, runs: np.ndarray, gap: np.ndarray,
    whole: bool, buf: np.ndarray, base: int, scratch: memoryview,
) -> np.ndarray | None:  # fmt: skip
    """Read file bytes off[i]:end[i] (file order) to buf[dst[i]:] (base: buf's address), one preadv per
    run of neighbours (runs: the first cell of each; whole: the run's bytes, gaps included, in one
    segment; else a segment per cell and one into scratch for the gap bytes before it, if any).
    None: every cell read whole; else (J,) bool, False where the file ended first."""
    n = len(off)
    if whole:  # one segment per run, from its first cell's start to its furthest end
        seg_off, seg_end = off[runs], np.maximum.reduceat(end, runs)
        iov = iovecs(len(runs))
        iov[:, 0], iov[:, 1] = base + dst[runs], seg_end - seg_off
        seg_first = np.arange(len(iov))
    elif not gap.any():  # tiles back to back in the file (Aperio): a segment per cell, no more
        seg_off, seg_end = off, end
        iov = iovecs(n)
        iov[:, 0], iov[:, 1] = base + dst, end - off
        seg_first = runs
    else:  # and a segment for the gap bytes (scratch, dropped) before a cell where there are any
        has_gap = np.concatenate([[False], gap > 0])
        has_gap[runs] = False
        seg_of = np.arange(n) + np.cumsum(has_gap)  # each cell's segment
        gaps = seg_of[has_gap] - 1
        iov = iovecs(n + len(gaps))
        iov[seg_of, 0], iov[seg_of, 1] = base + dst, end - off
        iov[gaps, 0], iov[gaps, 1] = address(scratch), gap[has_gap[1:]]
        seg_off, seg_end = np.empty(len(iov), np.int64), np.empty(len(iov), np.int64)
        seg_off[seg_of], seg_off[gaps] = off, off[has_gap] - gap[has_gap[1:]]
        seg_end[seg_of], seg_end[gaps] = end, off[has_gap]
        seg_first = seg_of[runs]
    calls: list[int] = []  # first segment of each read: every run, split at MAX_SEGMENTS_PER_READ
    for a, z in pairwise([*seg_first.tolist(), len(iov)]):
        calls.extend(range(a, z, MAX_SEGMENTS_PER_READ))
    short = False
    got = np.full(len(calls), 1 << 62, np.int64)  # bytes each read gave where fewer than asked
    for k, (a, z) in enumerate(pairwise([*calls, len(iov)])):
        start = int(seg_off[a])
        n_read = preadv(fd, iov[a:z], start)
        if n_read < int(seg_end[z - 1]) - start:
            got[k], short = n_read, True
    if not short:
        return None
    # the file ended first (a truncated slide): which cells a read covered, and each other one alone
    if whole:
        seg_of = _run_of(runs, n)
    elif not gap.any():
        seg_of = np.arange(n)
    call_of = np.searchsorted(calls, seg_of, side="right") - 1
    full = end - seg_off[calls][call_of] <= got[call_of]
    view = buf.data
    for i in np.flatnonzero(~full).tolist():  # each alone, as a pread would
        t0, count = int(dst[i]), int(end[i] - off[i])
        full[i] = os.preadv(fd, [view[t0 : t0 + count]], int(off[i])) == count
    return full

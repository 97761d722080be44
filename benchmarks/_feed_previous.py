"""The device-decode reader as it was at commit 7ae3dd4 (before the numpy-built iovecs), kept runnable
for comparison.

`read(reader, start, stop)` is RawSlideReader.read of that commit, with its `table_of_keys` and
`read_streams`: `os.preadv` with a memoryview slice per tile (and per gap), the stream header written
over each tile by a map of memoryview assignments, the JFIF check in several gathers.
benchmarks/embed_feed.py times it beside today's reader; tests/pipelines/embed/test_embed_feed.py checks that
both give the same batches.

    read(reader, start, stop) -> RawBatch
    read_streams(fd, offsets, counts, header, rgb, scratch) -> tile_bytes.Streams
"""

from __future__ import annotations

import os
from collections import deque
from itertools import pairwise, repeat
from typing import Any

import numpy as np

from wsi.pipelines.embed.batches import RawBatch
from wsi.pipelines.embed.device_decode import raw_tiles
from wsi.pipelines.embed.device_decode.jpeg import SOI
from wsi.pipelines.embed.device_decode.tile_bytes import MAX_GAP, Streams, batch_buffer, stream_header

MAX_CELLS_PER_READ = 500
_APP0, _JFIF = (0xFF, 0xE0), np.frombuffer(b"JFIF\x00", np.uint8)


def read(self: Any, start: int, stop: int) -> RawBatch:
    """RawSlideReader.read of commit 7ae3dd4 (the reader supplies st, lv, its fd, scratch and slide plans)."""
    st, lv = self.st, self.lv
    if self._slide is None:  # the whole slide at once: a batch then only slices arrays
        self._slide = raw_tiles._SlidePlans.of(self.plans(0, st.n), lv)
    sp = self._slide
    gh, gw = sp.extent[start:stop].max(axis=0, initial=1).tolist()  # this batch's table: no wider
    table, cells = table_of_keys(sp.keys[start:stop, :gh, :gw], lv.n_cols)
    flat = cells[:, 1] * lv.n_cols + cells[:, 0]
    streams = read_streams(
        self._fd, lv.offsets[flat], lv.counts[flat], stream_header(lv.tables, lv.rgb), lv.rgb,
        self._scratch,
    )  # fmt: skip
    if streams.missing.any():  # tiles the file does not hold (sparse TIFF): white, like openslide
        table[np.isin(table, np.flatnonzero(streams.missing))] = -1
    return RawBatch(
        slide_path=st.slide_path, backend=st.backend, mpp=st.mpp, side_um=st.tile_um,
        target_mpp=st.target_mpp, tile_px=sp.tile_px,
        coords_px=np.asarray(st.coords_px[start:stop], np.int64), level=lv.level,
        level_wh=(lv.width, lv.height), tile_wh=(lv.tile_w, lv.tile_h), data=streams.data,
        offsets=streams.offsets, lengths=streams.lengths, cells=cells, win=sp.win[start:stop],
        box=sp.box[start:stop], kind=sp.kind[start:stop], factor=sp.factor[start:stop],
        filt=sp.filt[start:stop], grid0=sp.grid0[start:stop], table=table,
    )  # fmt: skip


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

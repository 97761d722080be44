"""The device-decode reader as it was before issue 34 (commit c214031), kept runnable for comparison.

`legacy_read(reader, start, stop)` does what `RawSlideReader.read` did then: one `plan_region` object per
tile, a Python loop over the JPEG cells each window touches, one `os.pread` and one `complete_jpeg` per
cell, a join and a copy. benchmarks/embed_feed.py times it beside today's reader and the file-read limit;
tests/pipelines/embed/test_embed_feed.py checks that today's reader gives the same bytes and plans.

    legacy_read(reader, start, stop) -> LegacyBatch
    as_raw_batch(legacy, reader, start, stop) -> RawBatch     today's batch type, for the decoder
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image

from wsi.pipelines.embed.batches import RawBatch
from wsi.pipelines.embed.device_decode.jpeg import SOI, complete_jpeg
from wsi.slides.region import RegionKind


class LegacyBatch(NamedTuple):
    data: torch.Tensor  # (total,) uint8, the streams back to back
    lengths: list[int]
    cells: np.ndarray  # (J, 2)
    grid0: np.ndarray  # (B, 2)
    table: np.ndarray  # (B, GH, GW)
    win: np.ndarray
    box: np.ndarray
    kind: np.ndarray
    factor: np.ndarray
    filt: list[str]


def legacy_read(reader: Any, start: int, stop: int) -> LegacyBatch:
    """What RawSlideReader.read did before issue 34 (the reader supplies st, lv, plan() and its fd)."""
    st, lv = reader.st, reader.lv
    coords = np.asarray(st.coords_px[start:stop], np.int64)
    plans = [reader.plan(int(x), int(y)) for x, y in coords]
    b = len(plans)
    win, box = np.zeros((b, 4), np.int64), np.zeros((b, 3), np.float64)
    kind, factor, filt = np.zeros(b, np.int64), np.ones(b, np.int64), [""] * b
    for j, plan in enumerate(plans):
        win[j] = plan.window
        kind[j], factor[j] = int(plan.kind), plan.factor
        if plan.kind == RegionKind.RESAMPLE:
            box[j] = plan.box()
            filt[j] = plan.resample_filter().name
    grid0, table, cells = _cell_table(win, lv)
    streams, lengths = [], []
    for slot, (col, row) in enumerate(cells):
        stream = _stream(reader._fd, lv, int(col), int(row))
        if stream is None:
            table[table == slot] = -1
            stream = b""
        streams.append(stream)
        lengths.append(len(stream))
    data = np.frombuffer(b"".join(streams), np.uint8) if streams else np.zeros(0, np.uint8)
    return LegacyBatch(torch.from_numpy(data.copy()), lengths, cells, grid0, table, win, box, kind, factor,
                       filt)  # fmt: skip


def as_raw_batch(legacy: LegacyBatch, reader: Any, start: int, stop: int) -> RawBatch:
    """The legacy batch in today's RawBatch form (offsets from the lengths, filters as PIL codes)."""
    st, lv = reader.st, reader.lv
    lengths = np.asarray(legacy.lengths, np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    filt = np.asarray([int(Image.Resampling[f]) if f else -1 for f in legacy.filt], np.int64)
    return RawBatch(
        slide_path=st.slide_path, backend=st.backend, mpp=st.mpp, side_um=st.tile_um,
        target_mpp=st.target_mpp, tile_px=round(st.tile_um / st.target_mpp),
        coords_px=np.asarray(st.coords_px[start:stop], np.int64), level=lv.level,
        level_wh=(lv.width, lv.height), tile_wh=(lv.tile_w, lv.tile_h), data=legacy.data, offsets=offsets,
        lengths=lengths, cells=legacy.cells, win=legacy.win, box=legacy.box, kind=legacy.kind,
        factor=legacy.factor, filt=filt, grid0=legacy.grid0, table=legacy.table,
    )  # fmt: skip


def _stream(fd: int, lv: Any, col: int, row: int) -> bytes | None:
    i = row * lv.n_cols + col
    offset, count = int(lv.offsets[i]), int(lv.counts[i])
    if count == 0 or offset == 0:
        return None
    if count <= 2:
        return b""
    tile = os.pread(fd, count, offset)
    if len(tile) != count or tile[:2] != SOI:
        return b""
    return complete_jpeg(tile, lv.tables, lv.rgb)


def _cell_table(win: np.ndarray, lv: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    b = len(win)
    tw, th = lv.tile_w, lv.tile_h
    x0c, y0c = np.maximum(win[:, 0], 0), np.maximum(win[:, 1], 0)
    x1c = np.minimum(win[:, 0] + win[:, 2], lv.width)
    y1c = np.minimum(win[:, 1] + win[:, 3], lv.height)
    inside = (x1c > x0c) & (y1c > y0c)
    gx0, gy0 = x0c // tw, y0c // th
    gw = np.where(inside, (x1c - 1) // tw - gx0 + 1, 0)
    gh = np.where(inside, (y1c - 1) // th - gy0 + 1, 0)
    table = np.full((b, max(1, int(gh.max(initial=0))), max(1, int(gw.max(initial=0)))), -1, np.int64)
    slots: dict[tuple[int, int], int] = {}
    for j in range(b):
        for r in range(int(gh[j])):
            for c in range(int(gw[j])):
                cell = (int(gx0[j]) + c, int(gy0[j]) + r)
                table[j, r, c] = slots.setdefault(cell, len(slots))
    cells = np.array(list(slots) or np.zeros((0, 2)), np.int64).reshape(-1, 2)
    return np.stack([gx0, gy0], axis=1).astype(np.int64), table, cells

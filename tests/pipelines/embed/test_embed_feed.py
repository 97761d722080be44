"""The device-decode feed's reader (issue 34): plans as arrays, each JPEG tile read once per batch in
coalesced reads, streams completed in place. Every path gives the bytes, plans and pixels of the reader
before it (benchmarks/_feed_legacy.py, the code of commit c214031)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from _feed_legacy import LegacyBatch, as_raw_batch, legacy_read
from wsi.pipelines.embed.batches import RawBatch, SlideTiles
from wsi.pipelines.embed.device_decode import DeviceDecoder, RawSlideReader, complete_jpeg, tile_bytes
from wsi.pipelines.embed.device_decode.jpeg import SOI
from wsi.pipelines.embed.device_decode.tile_bytes import (
    MAX_GAP,
    batch_buffer,
    cell_table,
    read_streams,
    stream_header,
)
from wsi.slides.region import RegionKind, plan_region, plan_regions

APERIO = "CMU-1-Small-Region.svs"


# ------------------------------------------------------------------------------------- plans as arrays
@pytest.mark.parametrize(
    ("mpp", "downsamples", "side_um", "tile_px", "shifts"),
    [
        (0.25, (1.0, 4.0, 16.0), 256.0, 256, False),  # copy from level 1
        (0.25, (1.0,), 256.0, 256, False),  # 4 x 4 block means
        (0.46, (1.0, 2.0, 4.0), 256.0, 256, False),  # resampled, on and off the grid
        (0.499, (1.0, 4.000526), 256.0, 224, True),  # openslide's fractional level: margin, no snap
        (0.25, (1.0, 4.000526), 256.0, 256, True),
        (0.5, (1.0,), 112.0, 224, False),
    ],
)
def test_plan_regions_equal_plan_region_row_for_row(mpp, downsamples, side_um, tile_px, shifts) -> None:
    rng = np.random.default_rng(3)
    step = round(side_um / mpp)
    xs = np.concatenate([np.arange(0, 20) * step, rng.integers(-300, 40_000, 300), [0, 1, 3, 7]])
    ys = np.concatenate([np.arange(0, 20) * step, rng.integers(-300, 40_000, 300), [5, 0, 4001, 2]])
    kw = dict(side_um=side_um, target_mpp=side_um / tile_px, mpp=mpp, downsamples=downsamples,
              shifts_fractional_levels=shifts)  # fmt: skip
    plans = plan_regions(xs, ys, **kw)
    box, filt = plans.box(), plans.filters()
    kinds = set()
    for i, (x, y) in enumerate(zip(xs.tolist(), ys.tolist(), strict=True)):
        one = plan_region(x, y, **kw)
        kinds.add(one.kind)
        assert (plans.level, plans.tile_px, plans.side_px) == (one.level, one.tile_px, one.side_px)
        assert tuple(plans.win[i].tolist()) == one.window
        assert (plans.kind[i], plans.factor[i]) == (one.kind, one.factor)
        if one.kind == RegionKind.RESAMPLE:
            assert tuple(box[i].tolist()) == one.box()  # exactly: the same float operations
            assert filt[i] == int(one.resample_filter())
            assert tuple(plans.origin[i].tolist()) == one.origin
        else:
            assert filt[i] == -1 and not box[i].any()
    if (mpp, tile_px) == (0.46, 256):
        assert kinds == {RegionKind.RESAMPLE}


# ------------------------------------------------------------------------ today's reader vs the legacy one
def _tiles(path: Path, mpp: float, coords: list[tuple[int, int]], tile_um: float, tile_px: int) -> SlideTiles:
    return SlideTiles(
        slide_id=path.stem, slide_path=str(path), backend="openslide", mpp=mpp, tile_um=tile_um,
        target_mpp=tile_um / tile_px, tile_px=tile_px, coords_px=np.asarray(coords, np.int64).reshape(-1, 2),
        decode="device",
    )  # fmt: skip


def _streams_by_cell(raw: RawBatch | LegacyBatch) -> dict[tuple[int, int], bytes]:
    if isinstance(raw, RawBatch):
        return {tuple(c): bytes(raw.stream(j).numpy()) for j, c in enumerate(raw.cells.tolist())}
    offsets = np.concatenate([[0], np.cumsum(raw.lengths)]).tolist()
    data = raw.data.numpy()
    return {tuple(c): bytes(data[offsets[j] : offsets[j + 1]]) for j, c in enumerate(raw.cells.tolist())}


def _cells_of_table(table: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """(B, GH, GW, 2) the cell (col, row) behind each table entry, (-1, -1) where none."""
    out = np.full((*table.shape, 2), -1, np.int64)
    out[table >= 0] = cells[table[table >= 0]]
    return out


def _assert_same_batch(new: RawBatch, old: LegacyBatch) -> None:
    assert _streams_by_cell(new) == _streams_by_cell(old)  # byte for byte, every JPEG tile
    assert sorted(map(tuple, new.cells.tolist())) == sorted(map(tuple, old.cells.tolist()))
    np.testing.assert_array_equal(
        _cells_of_table(new.table, new.cells), _cells_of_table(old.table, old.cells)
    )
    for name in ("win", "box", "kind", "factor", "grid0"):
        np.testing.assert_array_equal(getattr(new, name), getattr(old, name))
    assert [f if f else "" for f in old.filt] == [
        "" if f < 0 else __import__("PIL.Image").Image.Resampling(f).name for f in new.filt.tolist()
    ]
    assert int(new.lengths.sum()) == sum(old.lengths)


def _grid(w: int, h: int, step: int) -> list[tuple[int, int]]:
    return [(x, y) for y in range(0, h, step) for x in range(0, w, step)]


@pytest.mark.parametrize(("mpp", "tile_px", "batch"), [(0.46, 256, 7), (0.25, 256, 5), (0.5, 224, 16)])
def test_reader_gives_the_legacy_bytes_plans_and_pixels(
    make_slide, mpp: float, tile_px: int, batch: int
) -> None:
    slide = make_slide(name=f"feed-{mpp}", size_um=(900.0, 700.0), mpp=mpp, seed=4)
    w, h = slide.width_px, slide.height_px
    coords = [*_grid(w, h, round(256 / mpp)), (37, 11), (w - 20, h - 30), (-50, 5)]  # edges, outside
    st = _tiles(slide.path, mpp, coords, 256.0, tile_px)
    reader = RawSlideReader.open(st)
    assert reader is not None
    try:
        with DeviceDecoder("cpu") as decoder:
            for start in range(0, st.n, batch):
                stop = min(start + batch, st.n)
                new, old = reader.read(start, stop), legacy_read(reader, start, stop)
                _assert_same_batch(new, old)
                got, ok = decoder.decode(new)
                want, ok_old = decoder.decode(as_raw_batch(old, reader, start, stop))
                assert ok.all() and ok_old.all()
                np.testing.assert_array_equal(got.numpy(), want.numpy())  # pixel for pixel
    finally:
        reader.close()


def test_real_aperio_tiles_with_tables_and_rgb_give_the_legacy_bytes(shared_data: Path) -> None:
    path = shared_data / "slides" / APERIO
    coords = [*_grid(2967, 2220, 400), (2900, 2100)]
    for tile_um, tile_px in ((256.0, 256), (112.0, 224), (64.0, 128)):
        st = _tiles(path, 0.499, coords, tile_um, tile_px)
        reader = RawSlideReader.open(st)
        assert reader is not None and reader.lv.rgb and reader.lv.tables
        try:
            new, old = reader.read(0, st.n), legacy_read(reader, 0, st.n)
            _assert_same_batch(new, old)
            with DeviceDecoder("cpu") as decoder:
                got, _ = decoder.decode(new)
                want, _ = decoder.decode(as_raw_batch(old, reader, 0, st.n))
            np.testing.assert_array_equal(got.numpy(), want.numpy())
        finally:
            reader.close()


def test_cell_table_maps_the_same_cells_as_the_legacy_loops(make_slide) -> None:
    slide = make_slide(name="feed-0.46", size_um=(900.0, 700.0), mpp=0.46, seed=4)
    st = _tiles(slide.path, 0.46, [(0, 0), (500, 500), (0, 0), (1900, 1400), (-900, -900)], 256.0, 256)
    reader = RawSlideReader.open(st)
    assert reader is not None
    try:
        grid0, table, cells = cell_table(reader.plans(0, st.n).win, reader.lv)
        old = legacy_read(reader, 0, st.n)
    finally:
        reader.close()
    np.testing.assert_array_equal(grid0, old.grid0)
    np.testing.assert_array_equal(_cells_of_table(table, cells), _cells_of_table(old.table, old.cells))
    assert len(cells) == len(set(map(tuple, cells.tolist())))  # each cell once, tile 0 twice in the batch
    assert (table[4] == -1).all()  # wholly outside the level


# ------------------------------------------------------------------------------ read_streams, edge cases
def _jpeg(seed: int, size: int) -> bytes:
    body = np.random.default_rng(seed).integers(0, 255, size, dtype=np.uint8).tobytes()
    return SOI + body


def _write(path: Path, pieces: list[tuple[int, bytes]], size: int) -> None:
    buf = bytearray(size)
    for offset, data in pieces:
        buf[offset : offset + len(data)] = data
    path.write_bytes(bytes(buf))


def _expected(fd: int, offset: int, count: int, tables: bytes | None, rgb: bool) -> bytes | None:
    if count == 0 or offset == 0:
        return None
    if count <= 2:
        return b""
    tile = os.pread(fd, count, offset)
    if len(tile) != count or tile[:2] != SOI:
        return b""
    return complete_jpeg(tile, tables, rgb)


@pytest.mark.parametrize("tables", [None, SOI + b"\xff\xdb\x00\x05abc" + b"\xff\xd9"])
@pytest.mark.parametrize("rgb", [False, True])
@pytest.mark.parametrize("per_read", [1024, 2, 3])
def test_read_streams_equal_complete_jpeg_of_each_pread(
    tmp_path: Path, monkeypatch, tables, rgb, per_read
) -> None:
    monkeypatch.setattr(tile_bytes, "MAX_SEGMENTS_PER_READ", per_read)
    jfif = SOI + b"\xff\xe0\x00\x10JFIF\x00\x01\x02\x00\x00\x01\x00\x01\x00\x00" + b"\xff\xdbrest-of-tile"
    bad_jfif = SOI + b"\xff\xe0\xff\xf0JFIF\x00" + b"xy"  # a length past the tile's end: clipped
    a, b, c, d, e = _jpeg(1, 300), _jpeg(2, 40), _jpeg(3, 1000), _jpeg(4, 77), _jpeg(5, 500)
    pieces = [
        (100, a), (100 + len(a), b), (100 + len(a) + len(b) + 7, c),  # back to back, a 7-byte gap
        (5000, d), (5000 + len(d) + MAX_GAP + 1, e),  # a gap too wide to read through
        (60_000, jfif), (60_200, bad_jfif), (61_000, b"\x00\x01notjpeg"), (62_000, b"\xff\xd8"),
    ]  # fmt: skip
    end = 62_000 + 2 + 100
    path = tmp_path / "tiles.bin"
    _write(path, pieces, end)
    offsets = [o for o, _ in pieces] + [0, 300, end - 50, 100]  # missing, count 0, cut by the end, again
    counts = [len(p) for _, p in pieces] + [10, 0, 200, len(a)]
    order = [9, 4, 0, 2, 1, 3, 12, 5, 8, 6, 10, 7, 11]  # not in file order
    offsets = np.asarray(offsets, np.int64)[order]
    counts = np.asarray(counts, np.int64)[order]
    fd = os.open(path, os.O_RDONLY)
    try:
        got = read_streams(
            fd, offsets, counts, stream_header(tables, rgb), rgb, memoryview(bytearray(MAX_GAP))
        )
        data = got.data.numpy()
        for j, (o, n) in enumerate(zip(offsets.tolist(), counts.tolist(), strict=True)):
            want = _expected(fd, o, n, tables, rgb)
            assert got.missing[j] == (want is None)
            stream = bytes(data[got.offsets[j] : got.offsets[j] + got.lengths[j]])
            assert stream == (want or b""), (j, o, n)
    finally:
        os.close(fd)
    assert (
        got.lengths[order.index(11)] == 0 and not got.missing[order.index(11)]
    )  # cut short by the end of the file: unusable, not missing
    if rgb:  # the JFIF segment is dropped, as complete_jpeg drops it
        assert b"JFIF" not in bytes(data[got.offsets[order.index(5)] :][: got.lengths[order.index(5)]])


def test_streams_of_complete_tiles_keep_the_files_layout(tmp_path: Path) -> None:
    a, b = _jpeg(1, 300), _jpeg(2, 50)
    path = tmp_path / "tiles.bin"
    _write(path, [(10, a), (10 + len(a) + 3, b)], 1000)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = read_streams(fd, np.array([10 + len(a) + 3, 10]), np.array([len(b), len(a)]), SOI, False,
                           memoryview(bytearray(MAX_GAP)))  # fmt: skip
    finally:
        os.close(fd)
    assert len(got.data) == len(a) + 3 + len(b)  # one read of the run, gap included
    assert got.offsets.tolist() == [len(a) + 3, 0] and got.lengths.tolist() == [len(b), len(a)]


# --------------------------------------------------------------------------- buffers: shared and pinned
class _Buffers(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        return batch_buffer(1000 + i)


def test_batch_buffers_are_made_in_shared_memory_inside_reader_processes() -> None:
    assert not batch_buffer(100).is_shared()  # in this process: a plain buffer
    got = list(DataLoader(_Buffers(), batch_size=None, num_workers=1))
    assert [len(t) for t in got] == [1000, 1001] and all(t.is_shared() for t in got)


def test_pinning_is_left_out_without_cuda(make_slide) -> None:
    from wsi.pipelines.embed.feed import iter_batches

    slide = make_slide(name="feed-0.46", size_um=(900.0, 700.0), mpp=0.46, seed=4)
    st = _tiles(slide.path, 0.46, _grid(1900, 1500, 557), 256.0, 256)
    batches = list(iter_batches([st], batch_size=3, readers=0, pin_memory=torch.cuda.is_available()))
    assert sum(len(b.ok) for b in batches) == st.n
    assert all(b.raw is not None and b.raw.data.is_pinned() == torch.cuda.is_available() for b in batches)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_batches_reuse_the_host_allocators_blocks(make_slide) -> None:
    from wsi.pipelines.embed.feed import iter_batches

    slide = make_slide(name="feed-0.46", size_um=(900.0, 700.0), mpp=0.46, seed=4)
    st = dataclasses.replace(_tiles(slide.path, 0.46, _grid(1900, 1500, 557), 256.0, 256))
    for _ in range(3):  # warm: the allocator's cache holds the blocks of a few batches
        list(iter_batches([st], batch_size=3, readers=0, pin_memory=True))
    before = torch.cuda.host_memory_stats().get("num_host_alloc", 0)
    for _ in range(5):
        for batch in iter_batches([st], batch_size=3, readers=0, pin_memory=True):
            assert batch.raw is not None and batch.raw.data.is_pinned()
    assert torch.cuda.host_memory_stats().get("num_host_alloc", 0) == before  # no new pinned memory

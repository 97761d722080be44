"""The device-decode reader's reads (issue 34): preadv with a numpy-built iovec array (libc, and os.preadv
where libc has none), runs cut short by the end of the file, the batch's cell table, and the reader of
commit 7ae3dd4 that benchmarks/embed_feed.py compares with (benchmarks/_feed_previous.py)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

import _feed_previous
from wsi.pipelines.embed.device_decode import RawSlideReader, complete_jpeg, iovec, tile_bytes
from wsi.pipelines.embed.device_decode.jpeg import SOI
from wsi.pipelines.embed.device_decode.tile_bytes import MAX_GAP, read_streams, stream_header, table_of_keys

TABLES = SOI + b"\xff\xdb\x00\x05abc" + b"\xff\xd9"
#: the first 11 bytes of a tile with a JFIF APP0 segment (length 16), as tifffile and PIL write them
JFIF = SOI + b"\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"


@pytest.fixture(params=["libc", "os.preadv"])
def preadv_path(request, monkeypatch) -> str:
    """Every test here runs through libc's preadv and through the os.preadv fallback."""
    if request.param == "os.preadv":
        monkeypatch.setattr(iovec, "_PREADV", None)
    else:
        assert iovec._PREADV is not None, "libc has no preadv here: the fallback is all that runs"
    return request.param


def _file(tmp_path: Path, data: bytes) -> int:
    path = tmp_path / "bytes.bin"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


# ------------------------------------------------------------------------------------------------ iovec
def test_preadv_fills_each_segment_in_order_and_stops_at_the_end_of_the_file(tmp_path, preadv_path):
    data = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    fd = _file(tmp_path, data)
    try:
        buf, scratch = np.zeros(4000, np.uint8), bytearray(64)
        iov = iovec.iovecs(4)
        iov[:] = [(buf.ctypes.data + 100, 300), (iovec.address(scratch), 50), (buf.ctypes.data, 0),
                  (buf.ctypes.data + 1000, 2000)]  # fmt: skip
        assert iovec.preadv(fd, iov, 10) == 2350
        assert bytes(buf[100:400]) == data[10:310] and bytes(scratch[:50]) == data[310:360]
        assert bytes(buf[1000:3000]) == data[360:2360]
        assert not buf[:100].any() and not buf[400:1000].any() and not buf[3000:].any()  # nothing else
        assert iovec.preadv(fd, iov, 4000) == 1000  # the file ends in the last segment
        assert bytes(buf[1000:1650]) == data[4350:]
        with pytest.raises(ValueError, match="IOV_MAX"):
            iovec.preadv(fd, iovec.iovecs(iovec.IOV_MAX + 1), 0)
    finally:
        os.close(fd)
    with pytest.raises(OSError):  # a closed file: the error, not a short read
        iovec.preadv(fd, iov, 0)


# -------------------------------------------------------------------------- read_streams, whole and not
def _tiles(n: int, seed: int, jfif: bool) -> list[bytes]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(20, 400, n)
    return [(JFIF if jfif and i % 2 else SOI) + rng.integers(0, 256, s, dtype=np.uint8).tobytes()
            for i, s in enumerate(sizes.tolist())]  # fmt: skip


@pytest.mark.parametrize(("tables", "rgb"), [(None, False), (TABLES, False), (TABLES, True), (None, True)])
@pytest.mark.parametrize("shuffled", [False, True])
def test_a_run_cut_short_by_the_end_of_the_file_keeps_the_tiles_read_before(
    tmp_path, monkeypatch, preadv_path, tables, rgb, shuffled
) -> None:
    tiles = _tiles(40, 1, jfif=rgb)
    offsets = np.cumsum([500] + [len(t) for t in tiles])[:-1]  # back to back, as Aperio writes them
    counts = np.asarray([len(t) for t in tiles])
    cut = int(offsets[-3]) + 5  # the file ends 5 bytes into the third last tile
    fd = _file(tmp_path, (bytes(500) + b"".join(tiles))[:cut])
    order = np.random.default_rng(2).permutation(len(tiles)) if shuffled else np.arange(len(tiles))
    alone: list[int] = []  # the cells read again one by one (as a pread loop would) after the short read
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda f, views, o: alone.append(o) or real(f, views, o))
    try:
        got = read_streams(fd, offsets[order], counts[order], stream_header(tables, rgb), rgb,
                           memoryview(bytearray(MAX_GAP)))  # fmt: skip
    finally:
        os.close(fd)
    if preadv_path == "libc":  # only those the file cut short: the others were read whole at once
        assert sorted(alone) == offsets[-3:].tolist()
    data = got.data.numpy()
    for j, i in enumerate(order.tolist()):
        stream = bytes(data[got.offsets[j] : got.offsets[j] + got.lengths[j]])
        want = complete_jpeg(tiles[i], tables, rgb) if i < len(tiles) - 3 else b""
        assert stream == want, (i, got.lengths[j])
    assert not got.missing.any()


@pytest.mark.parametrize("header", [SOI, stream_header(TABLES, True)])
def test_cells_in_file_order_are_neither_sorted_nor_reordered(tmp_path, monkeypatch, header) -> None:
    tiles = _tiles(30, 3, jfif=False)
    offsets = np.cumsum([100] + [len(t) + 7 for t in tiles])[:-1]  # 7-byte gaps: one read all the same
    counts = np.asarray([len(t) for t in tiles])
    body = bytearray(int(offsets[-1] + counts[-1]))
    for o, t in zip(offsets.tolist(), tiles, strict=True):
        body[o : o + len(t)] = t
    fd = _file(tmp_path, bytes(body))
    calls: list[int] = []
    real = tile_bytes.preadv
    monkeypatch.setattr(tile_bytes, "preadv", lambda f, iov, o: calls.append(len(iov)) or real(f, iov, o))
    monkeypatch.setattr(np, "argsort", None)  # no sort at all on this path
    try:
        got = read_streams(fd, offsets, counts, header, header != SOI, memoryview(bytearray(MAX_GAP)))
    finally:
        os.close(fd)
    assert calls == ([1] if header == SOI else [30 + 29])  # one read: a segment per tile and per gap
    data = got.data.numpy()
    for j, t in enumerate(tiles):
        assert bytes(data[got.offsets[j] : got.offsets[j] + got.lengths[j]]) == complete_jpeg(
            t, TABLES if header != SOI else None, header != SOI
        )


# -------------------------------------------------------------------------------- the batch's cell table
def test_table_of_keys_equals_the_previous_one_and_names_each_slots_key() -> None:
    rng = np.random.default_rng(0)
    for trial in range(300):
        b, gh, gw, n_cols = (int(v) for v in rng.integers(1, [50, 4, 4, 60]))
        keys = rng.integers(-1, 500, (b, gh, gw))
        if trial % 7 == 0:
            keys[:] = -1  # no window touches the level
        if trial % 5 == 0:
            keys[keys < 0] = 3  # every window touches it
        table, cells, flat = table_of_keys(keys, n_cols)
        old_table, old_cells = _feed_previous.table_of_keys(keys, n_cols)
        np.testing.assert_array_equal(table, old_table)
        np.testing.assert_array_equal(cells, old_cells)
        np.testing.assert_array_equal(flat, cells[:, 1] * n_cols + cells[:, 0])
        assert table.dtype == cells.dtype == np.int64 and cells.shape == (len(flat), 2)


# ------------------------------------------------------------- the reader benchmarks/embed_feed.py compares
@pytest.mark.parametrize("aperio", [False, True])
def test_the_reader_of_7ae3dd4_gives_todays_batches(make_slide, preadv_path, aperio) -> None:
    slide = make_slide(name="feed-0.46", size_um=(900.0, 700.0), mpp=0.46, seed=4)
    step = round(256 / 0.46)
    coords = [(x, y) for y in range(0, slide.height_px, step) for x in range(0, slide.width_px, step)]
    st = _slide_tiles(slide.path, coords)
    reader = RawSlideReader.open(st)
    assert reader is not None
    if aperio:  # the benchmark's stand-in: a JPEGTables header over each tile, RGB (JFIF dropped)
        reader.lv = dataclasses.replace(reader.lv, tables=SOI + bytes(285) + b"\xff\xd9", rgb=True)
    try:
        for start in range(0, st.n, 5):
            stop = min(start + 5, st.n)
            new, old = reader.read(start, stop), _feed_previous.read(reader, start, stop)
            for name in ("cells", "table", "lengths", "win", "grid0"):
                np.testing.assert_array_equal(getattr(new, name), getattr(old, name))
            for j in range(len(new.cells)):
                assert bytes(new.stream(j).numpy()) == bytes(old.stream(j).numpy())
    finally:
        reader.close()


def _slide_tiles(path: Path, coords: list[tuple[int, int]]):
    from wsi.pipelines.embed.batches import SlideTiles

    return SlideTiles(
        slide_id=path.stem, slide_path=str(path), backend="openslide", mpp=0.46, tile_um=256.0,
        target_mpp=1.0, tile_px=256, coords_px=np.asarray(coords, np.int64).reshape(-1, 2), decode="device",
    )  # fmt: skip

"""Tile files: exact layout, validation, atomic writes, and the zarr pixel cache."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from wsi.core.errors import TileFileError
from wsi.formats.tile_file import (
    TilePixelWriter,
    is_complete,
    open_tile_pixels,
    pixels_complete,
    read_tile_file,
    write_tile_file,
)
from wsi.formats.tile_meta import REQUIRED_ATTRS, TileFileMeta


def _attrs(n: int) -> dict:
    return {
        "slide_id": "s1", "slide_path": "/data/s1.svs", "tile_size_um": 256.0, "tile_size_px": 256,
        "mpp": 0.5, "target_mpp": 1.0, "level0_width": 4000, "level0_height": 3000,
        "backend": "openslide", "vendor": "aperio", "params": {"tile_um": 256.0},
        "n_grid": 10, "n_tissue": n + 2, "n_background": 1, "n_blurry": 1, "n_kept": n,
        "wsi_version": "0.1.0",
    }  # fmt: skip


def _write(path: Path, n: int = 3) -> None:
    coords = np.arange(n * 2).reshape(n, 2) * 512
    meta = TileFileMeta.from_attrs(_attrs(n), source="test")
    write_tile_file(path, coords=coords, coords_um=coords * 0.5, meta=meta)


def test_layout_matches_contract(tmp_path: Path) -> None:
    path = tmp_path / "tiles" / "s1.h5"
    _write(path)
    with h5py.File(path) as h5:
        assert h5["coords"].dtype == np.int64 and h5["coords"].shape == (3, 2)
        assert h5["coords_um"].dtype == np.float32
        assert h5.attrs["format"] == "wsi-tiles" and h5.attrs["format_version"] == 1
        assert set(REQUIRED_ATTRS) <= set(h5.attrs)
        assert json.loads(h5.attrs["params"]) == {"tile_um": 256.0}
    tf = read_tile_file(path)
    assert len(tf) == 3 and tf.slide_id == "s1" and tf.tile_um == 256.0 and tf.mpp == 0.5
    assert tf.params == {"tile_um": 256.0}
    np.testing.assert_array_equal(tf.coords_um, tf.coords * 0.5)
    assert is_complete(path)
    assert [p.name for p in path.parent.iterdir()] == ["s1.h5"]  # no temporary left behind


def test_incomplete_or_foreign_files_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "s1.h5"
    _write(path)
    with h5py.File(path, "a") as h5:
        h5.attrs["complete"] = False
    assert not is_complete(path)
    with pytest.raises(TileFileError, match="incomplete"):
        read_tile_file(path)

    foreign = tmp_path / "clam.h5"
    with h5py.File(foreign, "w") as h5:
        h5["coords"] = np.zeros((2, 2), np.int64)
    assert not is_complete(foreign)
    with pytest.raises(TileFileError, match="not a wsi tile file"):
        read_tile_file(foreign)

    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"\x89HDF\r\n" + b"\0" * 10)
    assert not is_complete(junk)
    with pytest.raises(TileFileError):
        read_tile_file(junk)
    assert not is_complete(tmp_path / "missing.h5")
    with pytest.raises(TileFileError, match="not found"):
        read_tile_file(tmp_path / "missing.h5")


def test_interrupted_write_leaves_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s1.h5"
    _write(path, n=2)

    def boom(self, name, value):
        raise RuntimeError("disk full")

    monkeypatch.setattr(h5py.AttributeManager, "__setitem__", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        _write(path, n=5)
    monkeypatch.undo()
    assert len(read_tile_file(path)) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["s1.h5"]


def test_pixel_store_round_trip_and_atomic(tmp_path: Path) -> None:
    path = tmp_path / "s1.zarr"
    rng = np.random.default_rng(0)
    tiles = rng.integers(0, 255, (5, 16, 16, 3), dtype=np.uint8)
    with TilePixelWriter(path, n_max=8, tile_px=16, attrs={"slide_id": "s1"}) as writer:
        writer.append(tiles[:2])
        writer.append(tiles[2:0])
        writer.append(tiles[2:])
    array = open_tile_pixels(path)
    assert array.shape == (5, 16, 16, 3) and array.chunks == (1, 16, 16, 3)
    np.testing.assert_array_equal(array[:], tiles)
    assert pixels_complete(path, n=5) and not pixels_complete(path, n=4)

    with pytest.raises(RuntimeError), TilePixelWriter(path, n_max=8, tile_px=16) as writer:
        writer.append(tiles[:1])
        raise RuntimeError("interrupted")
    np.testing.assert_array_equal(open_tile_pixels(path)[:], tiles)  # old store untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s1.zarr"]


def test_pixel_store_not_trusted_when_foreign(tmp_path: Path) -> None:
    import zarr

    zarr.create_array(store=str(tmp_path / "x.zarr"), shape=(2, 4, 4, 3), dtype="uint8")
    assert not pixels_complete(tmp_path / "x.zarr")
    with pytest.raises(TileFileError, match="incomplete"):
        open_tile_pixels(tmp_path / "x.zarr")
    (tmp_path / "y.zarr").mkdir()
    assert not pixels_complete(tmp_path / "y.zarr")


def test_typed_metadata_round_trips_every_section(tmp_path: Path) -> None:
    """The tile stage writes a TileFileMeta; reading the file gives the same record back."""
    from dataclasses import replace

    from wsi.formats.tile_meta import BackgroundRecord, DamageRecord, RoiRecord, SegmentationRecord

    base = TileFileMeta.from_attrs(_attrs(2), source="test")
    full = replace(
        base,
        mpp_source="metadata",
        background=BackgroundRecord(kind="dark", reason="fluorescence", choice="auto"),
        empty_reason="",
        damage=DamageRecord(1, 2, 5, regions=((0, 0, 256, 256, 0),)),
        roi=RoiRecord(path="/r.geojson", sha256="ab" * 32, rule="centre", n_included=1, n_excluded=0,
                      n_outside=4),
        segmentation=SegmentationRecord(models={"tissue": {"name": "grandqc"}}, n_artifact=3,
                                        artifact_counts={"artifact: pen": 3}),
    )  # fmt: skip
    path = tmp_path / "s1.h5"
    coords = np.zeros((2, 2), dtype=np.int64)
    write_tile_file(path, coords=coords, coords_um=coords.astype(np.float32), meta=full)
    assert read_tile_file(path).meta == full
    with h5py.File(path) as h5:  # the stored layout is the flat one readers of format 1 know
        assert h5.attrs["background"] == "dark" and h5.attrs["n_outside_roi"] == 4
        assert json.loads(h5.attrs["artifact_counts"]) == {"artifact: pen": 3}


def test_a_mistyped_or_missing_attribute_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s1.h5"
    _write(path)
    with h5py.File(path, "a") as h5:
        h5.attrs["tile_size_px"] = "big"
    with pytest.raises(TileFileError, match=r"s1\.h5.*tile_size_px.*wsi tile --overwrite"):
        read_tile_file(path)
    assert not is_complete(path)
    _write(path)
    with h5py.File(path, "a") as h5:
        del h5.attrs["n_blurry"]
    with pytest.raises(TileFileError, match="n_blurry"):
        read_tile_file(path)

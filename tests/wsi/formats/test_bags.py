"""Bags: our layout round-trips; STAMP, CLAM and TRIDENT layouts load into the same in-memory bag."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from wsi.core.errors import BagFormatError
from wsi.formats.bags import (
    BagProvenance,
    bag_layout,
    bag_length,
    is_complete_bag,
    read_bag,
    read_bag_attrs,
    write_bag,
)

MPP = 0.5  # level-0 um/px of the imagined slide
TILE_UM = 256.0
TILE_PX0 = int(TILE_UM / MPP)  # 512 level-0 px


def _data(n: int = 7, d: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(n, d)).astype(np.float32)
    coords_px = np.stack([np.arange(n) * TILE_PX0, np.arange(n) % 3 * TILE_PX0], axis=1).astype(np.int64)
    coords_um = (coords_px * MPP).astype(np.float32)
    return feats, coords_um, coords_px


def _write_ours(path: Path, dtype: str = "float32") -> BagProvenance:
    feats, coords_um, coords_px = _data()
    provenance = BagProvenance(
        slide_id="s1", encoder="retccl", weights_sha256="abc", tile_um=TILE_UM, tile_px=256,
        mpp=MPP, level0_width=5000, level0_height=3000,
        tile_params={"tile_size_um": TILE_UM, "target_mpp": 1.0}, n_bad_tiles=0,
    )  # fmt: skip
    write_bag(path, feats=feats, coords_um=coords_um, coords_px=coords_px, provenance=provenance, dtype=dtype)
    return provenance


def _write_stamp(path: Path) -> None:
    feats, coords_um, _ = _data()
    with h5py.File(path, "w") as h5:
        h5["feats"] = feats
        h5["coords"] = coords_um
        h5.attrs["extractor"] = "ctranspath"
        h5.attrs["unit"] = "um"
        h5.attrs["tile_size_um"] = TILE_UM
        h5.attrs["tile_size_px"] = 224


def _write_clam(path: Path, *, level: int = 0, with_attrs: bool = True) -> None:
    feats, _, coords_px = _data()
    with h5py.File(path, "w") as h5:
        h5["features"] = feats
        ds = h5.create_dataset("coords", data=coords_px)
        if with_attrs:
            downsample = 2.0**level
            ds.attrs["patch_size"] = int(TILE_PX0 / downsample)  # size at patch_level
            ds.attrs["patch_level"] = level
            ds.attrs["downsample"] = np.array([downsample, downsample])


def _write_trident(path: Path, *, magnification: bool = True) -> None:
    feats, _, coords_px = _data()
    with h5py.File(path, "w") as h5:
        h5["features"] = feats
        ds = h5.create_dataset("coords", data=coords_px)
        ds.attrs["patch_size"] = 256
        ds.attrs["patch_size_level0"] = TILE_PX0
        ds.attrs["target_magnification"] = 10
        if magnification:  # 20x: TRIDENT's nominal 10 / 20 = 0.5 um/px, which is MPP
            ds.attrs["level0_magnification"] = 20


def test_our_bag_round_trip_and_contract(tmp_path: Path) -> None:
    path = tmp_path / "features" / "retccl" / "s1.h5"
    provenance = _write_ours(path, dtype="float16")
    feats, coords_um, coords_px = _data()
    with h5py.File(path, "r") as h5:  # the on-disk contract other tools rely on
        assert h5["feats"].dtype == np.float16 and h5["feats"].shape == (7, 16)
        assert h5["coords"].dtype == np.float32 and h5["coords_px"].dtype == np.int64
        assert isinstance(h5.get("features", getlink=True), h5py.SoftLink)
        assert np.array_equal(h5["features"][()], h5["feats"][()])
        assert (
            h5.attrs["unit"] == "um" and h5.attrs["format"] == "wsi-bag" and h5.attrs["format_version"] == 1
        )
        for key in ("encoder", "weights_sha256", "tile_size_px", "mpp", "level0_width", "level0_height",
                    "wsi_version", "created", "tile_params"):  # fmt: skip
            assert key in h5.attrs
    bag = read_bag(path)
    assert bag.meta["layout"] == "wsi" and bag.slide_id == "s1" and len(bag) == 7 and bag.dim == 16
    np.testing.assert_allclose(bag.feats, feats, atol=1e-2)  # float16 storage
    np.testing.assert_array_equal(bag.coords_um, coords_um)
    np.testing.assert_array_equal(bag.coords_px, coords_px)
    assert bag.tile_um == TILE_UM and bag.meta["encoder"] == "retccl"
    assert bag_length(path) == 7 and bag_layout(path) == "wsi"
    assert read_bag_attrs(path)["n_bad_tiles"] == 0
    assert bag.provenance == provenance  # written whole, read back whole
    assert BagProvenance.from_dict(provenance.to_dict(), source="t") == provenance
    assert is_complete_bag(path, encoder="retccl", weights_sha256="abc")
    assert not is_complete_bag(path, encoder="retccl", weights_sha256="other")
    assert not is_complete_bag(tmp_path / "missing.h5", encoder="retccl", weights_sha256="abc")
    assert not list(path.parent.glob(".*"))  # no temp files left behind


def test_rows_reads_a_subset_in_the_asked_order(tmp_path: Path) -> None:
    path = tmp_path / "s1.h5"
    _write_ours(path)
    full = read_bag(path)
    part = read_bag(path, rows=[5, 1, 5])
    np.testing.assert_array_equal(part.feats, full.feats[[5, 1, 5]])
    np.testing.assert_array_equal(part.coords_um, full.coords_um[[5, 1, 5]])


@pytest.mark.parametrize("layout", ["stamp", "clam", "clam-level1", "trident"])
def test_foreign_layouts_load_to_the_same_bag(tmp_path: Path, layout: str) -> None:
    ours = tmp_path / "ours.h5"
    _write_ours(ours)
    path = tmp_path / f"{layout}.h5"
    if layout == "stamp":
        _write_stamp(path)
    elif layout.startswith("clam"):
        _write_clam(path, level=1 if layout.endswith("1") else 0)
    else:
        _write_trident(path)
    bag = read_bag(path, mpp=MPP) if layout != "stamp" else read_bag(path)
    ref = read_bag(ours)
    assert bag.meta["layout"] == layout.split("-")[0]
    np.testing.assert_array_equal(bag.feats, ref.feats)
    np.testing.assert_allclose(bag.coords_um, ref.coords_um)
    assert bag.coords_um.dtype == np.float32
    assert bag.tile_um == pytest.approx(TILE_UM)
    assert bag.slide_id == layout


@pytest.mark.parametrize("layout", ["clam", "trident"])
def test_pixel_layouts_need_the_mpp(tmp_path: Path, layout: str) -> None:
    path = tmp_path / f"{layout}.h5"
    if layout == "clam":
        _write_clam(path)
    else:
        _write_trident(path, magnification=False)  # with it, TRIDENT's bag gives its own mpp
    with pytest.raises(BagFormatError, match=r"mpp") as err:
        read_bag(path)
    assert str(path) in str(err.value)
    assert "--mpp" in str(err.value) and "`mpp` column" in str(err.value)  # the options that fix it


def test_missing_attribute_is_named(tmp_path: Path) -> None:
    path = tmp_path / "clam.h5"
    _write_clam(path, level=1)
    with h5py.File(path, "a") as h5:  # a level-1 patch size means nothing without that level's downsample
        del h5["coords"].attrs["downsample"]
    with pytest.raises(BagFormatError, match=r"`downsample`") as err:
        read_bag(path, mpp=MPP)
    assert str(path) in str(err.value)
    stamp = tmp_path / "old_stamp.h5"
    with h5py.File(stamp, "w") as h5:
        h5["feats"] = np.zeros((2, 4), np.float32)
        h5["coords"] = np.zeros((2, 2), np.float32)
    with pytest.raises(BagFormatError, match=r"`tile_size_um`"):
        read_bag(stamp)


def test_not_a_bag(tmp_path: Path) -> None:
    path = tmp_path / "junk.h5"
    path.write_bytes(b"not hdf5")
    with pytest.raises(BagFormatError, match=r"junk\.h5"):
        read_bag(path)
    with h5py.File(tmp_path / "x.h5", "w") as h5:
        h5["something"] = np.zeros(3)
    with pytest.raises(BagFormatError, match="coords"):
        read_bag(tmp_path / "x.h5")


def test_float16_overflow_is_refused(tmp_path: Path) -> None:
    feats, coords_um, coords_px = _data()
    feats[0, 0] = 1e6
    with pytest.raises(BagFormatError, match="float32"):
        provenance = BagProvenance(
            slide_id="b", encoder="e", weights_sha256="w", tile_um=1, tile_px=1, mpp=1,
            level0_width=1, level0_height=1, tile_params={},
        )  # fmt: skip
        write_bag(
            tmp_path / "b.h5", feats=feats, coords_um=coords_um, coords_px=coords_px, provenance=provenance
        )
    assert not (tmp_path / "b.h5").exists()


def test_trident_mpp_comes_from_its_magnification_and_a_given_mpp_wins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "trident.h5"
    _write_trident(path)  # level0_magnification 20 -> 10 / 20 = 0.5 um/px
    with caplog.at_level("INFO", logger="wsi.formats.bags"):
        bag = read_bag(path)
    assert bag.mpp == 0.5 and "level0_magnification=20" in bag.mpp_source
    assert bag.tile_um == pytest.approx(TILE_UM) and bag.tile_px0 == TILE_PX0
    np.testing.assert_allclose(bag.coords_um, bag.coords_px * 0.5)
    assert "derived from TRIDENT's level0_magnification=20" in caplog.text  # the log says so
    given = read_bag(path, mpp=0.25)  # a real scanner mpp beats the nominal one
    assert given.mpp == 0.25 and given.mpp_source == "given" and given.tile_um == TILE_PX0 * 0.25
    np.testing.assert_allclose(given.coords_um, given.coords_px * 0.25)


def test_clam_feature_bag_without_attributes_gets_its_tile_size_from_the_grid(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "clam.h5"
    _write_clam(path, with_attrs=False)  # as CLAM's extract_features_fp.py writes it: no attributes
    with caplog.at_level("INFO", logger="wsi.formats.bags"):
        bag = read_bag(path, mpp=MPP)
    assert bag.tile_px0 == TILE_PX0 and bag.tile_um == pytest.approx(TILE_UM)
    assert f"inferred {TILE_PX0} level-0 px from the coordinate grid" in caplog.text
    np.testing.assert_allclose(bag.coords_um, _data()[1])


def test_pixel_bag_without_mpp_loads_in_pixels_when_positions_are_not_needed(tmp_path: Path) -> None:
    path = tmp_path / "clam.h5"
    _write_clam(path, with_attrs=False)
    bag = read_bag(path, require_um=False)
    assert bag.coords_um is None and bag.tile_um is None and bag.mpp is None
    np.testing.assert_array_equal(bag.coords_px, _data()[2])
    assert bag.tile_px0 == TILE_PX0 and len(bag) == 7


def test_grid_step_is_the_most_common_step() -> None:
    from wsi.formats.bags import grid_step

    xs = np.array([0, 224, 448, 672, 1120, 1344])  # a gap (missing tiles) does not change the step
    coords = np.stack([xs, np.zeros_like(xs)], axis=1)
    assert grid_step(coords) == 224.0
    assert grid_step(coords[:1]) is None
    assert grid_step(np.array([[0.0, 0.0], [112.5, 112.5]], np.float32)) == 112.5


def test_older_stamp_layouts_load(tmp_path: Path) -> None:
    feats, coords_um, _ = _data()
    v20 = tmp_path / "v20.h5"  # STAMP 2.0: `tile_size` + unit "um" (stamp/modeling/data.py:764-770)
    with h5py.File(v20, "w") as h5:
        h5["feats"], h5["coords"] = feats, coords_um
        h5.attrs["tile_size"], h5.attrs["unit"] = TILE_UM, "um"
    assert read_bag(v20).tile_um == TILE_UM
    no_size = tmp_path / "unit_only.h5"  # micrometres, but no size: inferred from the grid
    with h5py.File(no_size, "w") as h5:
        h5["feats"], h5["coords"] = feats, coords_um
        h5.attrs["unit"] = "um"
    assert read_bag(no_size).tile_um == TILE_UM


def test_an_empty_trident_bag_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "empty.h5"
    with h5py.File(path, "w") as h5:  # TRIDENT's empty slide (WSI.py:953-978)
        h5["features"] = np.zeros((0,), np.float32)
        h5.create_dataset("coords", data=np.zeros((0, 2), np.int64)).attrs["patch_size_level0"] = 512
    with pytest.raises(BagFormatError, match="no tiles") as err:
        read_bag(path, mpp=MPP)
    assert str(path) in str(err.value)

"""Files written by the wsi before the bag/tile-file modules were restructured (format_version 1) still
load, with the same arrays and provenance. The fixtures are written here with raw h5py exactly as the
old writers did (wsi/bags.py `write_bag` + the embed stage's extra attributes, wsi/tilefile.py
`write_tile_file`), so the test fails if the readers stop accepting them."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.formats.bags import (
    BagProvenance,
    bag_info,
    is_complete_bag,
    read_bag,
    read_bag_header,
    write_bag,
)
from wsi.formats.tile_file import is_tile_file, read_tile_file, tile_file_info, write_tile_file
from wsi.formats.tile_meta import REQUIRED_ATTRS
from wsi.pipelines.inputs import Item
from wsi.pipelines.inputs.bags import BagInput

N, D = 5, 8
TILE_PARAMS = {"tile_um": 256.0, "tile_px": 224, "min_tissue": 0.5}
#: the root attributes the embed stage of the old layout wrote (write_bag + engine + stage extras)
OLD_ATTRS: dict[str, object] = {
    "slide_id": "old-1",
    "encoder": "timm:resnet18",
    "weights_sha256": "ab" * 32,
    "tile_size_um": 256.0,
    "tile_size_px": 224,
    "unit": "um",
    "mpp": 0.2527,
    "level0_width": 40000,
    "level0_height": 30000,
    "wsi_version": "0.1.0",
    "created": "2025-01-02T03:04:05+00:00",
    "tile_params": json.dumps(TILE_PARAMS),
    "n_tiles": N,
    "format": "wsi-bag",
    "format_version": 1,
    "target_mpp": 256.0 / 224,
    "tile_file": "/data/run/tiles/old-1.h5",
    "encoder_id": "timm-resnet18",
    "input_px": 224,
    "precision": "bf16",
    "n_bad_tiles": 1,
    "n_tiles_requested": N + 1,
    "pixel_source": "slide",
    "slide_path": "/data/slides/old-1.svs",
}


def _arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    feats = rng.normal(size=(N, D)).astype(np.float16)
    coords_px = np.stack([np.arange(N) * 1013, np.arange(N) % 2 * 1013], axis=1).astype(np.int64)
    coords_um = (coords_px * 0.2527).astype(np.float32)
    return feats, coords_um, coords_px


def _write_old_bag(path: Path) -> None:
    """Exactly the old `wsi.formats.bags.write_bag` (called by the embed stage), without using it."""
    feats, coords_um, coords_px = _arrays()
    with h5py.File(path, "w") as h5:
        h5.create_dataset("feats", data=feats, chunks=(N, D))
        h5.create_dataset("coords", data=coords_um)
        h5.create_dataset("coords_px", data=coords_px)
        h5["features"] = h5py.SoftLink("/feats")
        for key, value in OLD_ATTRS.items():
            h5.attrs[key] = value


def test_an_old_bag_loads_with_the_same_arrays_and_provenance(tmp_path: Path) -> None:
    path = tmp_path / "old-1.h5"
    _write_old_bag(path)
    feats, coords_um, coords_px = _arrays()
    bag = read_bag(path)
    assert bag.meta["layout"] == "wsi" and bag.slide_id == "old-1" and bag.tile_um == 256.0
    np.testing.assert_array_equal(bag.feats, feats)
    np.testing.assert_array_equal(bag.coords_um, coords_um)
    np.testing.assert_array_equal(bag.coords_px, coords_px)
    prov = bag.provenance
    assert prov is not None
    assert prov == BagProvenance(
        slide_id="old-1", encoder="timm:resnet18", weights_sha256="ab" * 32, tile_um=256.0,
        tile_px=224, mpp=0.2527, level0_width=40000, level0_height=30000, tile_params=TILE_PARAMS,
        target_mpp=256.0 / 224, encoder_id="timm-resnet18", input_px=224, precision="bf16",
        n_tiles_requested=N + 1, n_bad_tiles=1, pixel_source="slide", slide_path="/data/slides/old-1.svs",
        tile_file="/data/run/tiles/old-1.h5", wsi_version="0.1.0", created="2025-01-02T03:04:05+00:00",
    )  # fmt: skip
    for key, value in OLD_ATTRS.items():  # every attribute is still in meta, unchanged
        assert bag.meta[key] == value, key
    assert is_complete_bag(path, encoder="timm:resnet18", weights_sha256="ab" * 32)
    header = read_bag_header(path)
    assert (header.layout, header.n_tiles, header.dim, header.dtype) == ("wsi", N, D, "float16")


def test_the_new_writer_writes_the_old_layout(tmp_path: Path) -> None:
    old, new = tmp_path / "old.h5", tmp_path / "new.h5"
    _write_old_bag(old)
    feats, coords_um, coords_px = _arrays()
    write_bag(new, feats=feats, coords_um=coords_um, coords_px=coords_px,
              provenance=read_bag(old).provenance, dtype="float16")  # type: ignore[arg-type]  # fmt: skip
    with h5py.File(old) as a, h5py.File(new) as b:
        # the old layout, plus STAMP's `feat_type` (issue 10: STAMP refuses bags without it)
        assert set(a.attrs) | {"feat_type"} == set(b.attrs) and b.attrs["feat_type"] == "tile"
        for key in a.attrs:  # same values and the same HDF5 types (float64 stays float64, ...)
            va, vb = a.attrs[key], b.attrs[key]
            assert va == vb and type(va) is type(vb), (key, va, vb)
        for name in ("feats", "coords", "coords_px"):
            assert a[name].dtype == b[name].dtype and np.array_equal(a[name][()], b[name][()])
        assert isinstance(b.get("features", getlink=True), h5py.SoftLink)


def test_old_bags_feed_training_and_info_as_before(tmp_path: Path) -> None:
    path = tmp_path / "old-1.h5"
    _write_old_bag(path)
    items = [Item(id="old-1", path=path, label=0)]
    prov = BagInput().provenance(items)
    assert prov == {
        "encoder": "timm:resnet18", "weights_sha256": "ab" * 32, "tile_size_um": 256.0, "tile_size_px": 224,
        "tile_params": TILE_PARAMS, "target_mpp": 256.0 / 224, "input_px": 224, "precision": "bf16",
        "feature_dim": D, "bag_format": "wsi-bag", "stain_norm": None, "stain_reference_sha256": None,
    }  # fmt: skip
    assert BagInput().model_kwargs(items) == {"in_dim": D}
    info = bag_info(path)
    assert info["kind"] == "feature bag (wsi layout)" and info["tiles"] == N and info["dim"] == D
    assert info["encoder"] == "timm:resnet18" and info["n_bad_tiles"] == 1


def _write_old_tile_file(path: Path) -> None:
    """Exactly the old `wsi.tilefile.write_tile_file`, without using it."""
    _, coords_um, coords_px = _arrays()
    attrs = {
        "slide_id": "old-1", "slide_path": "/data/slides/old-1.svs", "tile_size_um": 256.0,
        "tile_size_px": 224, "mpp": 0.2527, "target_mpp": 256.0 / 224, "level0_width": 40000,
        "level0_height": 30000, "backend": "openslide", "vendor": "aperio", "params": TILE_PARAMS,
        "n_grid": 20, "n_tissue": 9, "n_background": 2, "n_blurry": 1, "n_unreadable": 1, "n_kept": N,
        "mpp_source": "metadata", "wsi_version": "0.1.0",
    }  # fmt: skip
    with h5py.File(path, "w") as h5:
        h5.create_dataset("coords", data=coords_px)
        h5.create_dataset("coords_um", data=coords_um)
        for name, value in attrs.items():
            h5.attrs[name] = json.dumps(value, sort_keys=True) if name == "params" else value
        h5.attrs["format"] = "wsi-tiles"
        h5.attrs["format_version"] = 1
        h5.attrs["complete"] = True


def test_an_old_tile_file_loads_and_is_told_from_a_bag(tmp_path: Path) -> None:
    tiles, bag = tmp_path / "tiles.h5", tmp_path / "bag.h5"
    _write_old_tile_file(tiles)
    _write_old_bag(bag)
    _, coords_um, coords_px = _arrays()
    tf = read_tile_file(tiles)
    np.testing.assert_array_equal(tf.coords, coords_px)
    np.testing.assert_array_equal(tf.coords_um, coords_um)
    assert tf.params == TILE_PARAMS and tf.target_mpp == pytest.approx(256.0 / 224) and len(tf) == N
    assert is_tile_file(tiles) and not is_tile_file(bag) and not is_tile_file(tmp_path / "missing.h5")
    info = tile_file_info(tiles)
    assert info["kind"] == "tile file (wsi-tiles)" and info["tiles"] == N and info["n_unreadable"] == 1
    result = CliRunner().invoke(cli, ["info", str(tiles), str(bag), "--json"])
    assert result.exit_code == 0, result.output
    kinds = [json.loads(line)["kind"] for line in result.output.splitlines()]
    assert kinds == ["tile file (wsi-tiles)", "feature bag (wsi layout)"]


def test_a_tile_file_rewritten_by_this_version_keeps_the_old_attribute_names(tmp_path: Path) -> None:
    """The fields are `tile_um` / `tile_px`; the file keeps `tile_size_um` / `tile_size_px`, so a file this
    version writes reads in earlier versions and other tools, and an old one reads here the same."""
    old, new = tmp_path / "old.h5", tmp_path / "new.h5"
    _write_old_tile_file(old)
    tf = read_tile_file(old)
    assert (tf.meta.tile_um, tf.meta.tile_px, tf.tile_um, tf.tile_px) == (256.0, 224, 256.0, 224)
    write_tile_file(new, coords=tf.coords, coords_um=tf.coords_um, meta=tf.meta)
    with h5py.File(old) as a, h5py.File(new) as b:
        assert {"tile_size_um", "tile_size_px"} <= set(b.attrs) and not {"tile_um", "tile_px"} & set(b.attrs)
        for key in a.attrs:  # every old attribute, under its old name, with its value
            assert np.all(a.attrs[key] == b.attrs[key]), key
    assert read_tile_file(new).meta == tf.meta
    assert {"tile_size_um", "tile_size_px"} <= set(REQUIRED_ATTRS)


def test_bag_provenance_fields_are_tile_um_and_tile_px_stored_under_the_old_names(tmp_path: Path) -> None:
    path = tmp_path / "old-1.h5"
    _write_old_bag(path)
    prov = read_bag(path).provenance
    assert prov is not None and (prov.tile_um, prov.tile_px) == (256.0, 224)
    stored = prov.to_dict()
    assert (stored["tile_size_um"], stored["tile_size_px"]) == (256.0, 224) and "tile_um" not in stored
    assert BagProvenance.from_dict(stored, source="test") == prov


def test_an_old_bag_gains_stamps_feat_type_and_nothing_else(tmp_path: Path) -> None:
    from wsi.formats.bags import upgrade_bag

    path = tmp_path / "old-1.h5"
    _write_old_bag(path)
    before = read_bag(path)
    assert upgrade_bag(path) and not upgrade_bag(path)  # once
    with h5py.File(path) as h5:
        assert h5.attrs["feat_type"] == "tile" and type(h5.attrs["feat_type"]) is str
        assert {k: h5.attrs[k] for k in OLD_ATTRS} == OLD_ATTRS  # every old attribute as it was
    after = read_bag(path)
    np.testing.assert_array_equal(after.feats, before.feats)
    np.testing.assert_array_equal(after.coords_um, before.coords_um)
    assert after.provenance == before.provenance
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_info_shows_every_count_a_tile_file_stores_and_names_a_bags_two_precisions(tmp_path: Path) -> None:
    """`wsi info` on a tile file lists where every tissue tile went, the artifact filters' counts among
    them (ink), not only kept / background / blurry; on a bag it says what the file stores the features
    as and what the encoder computed in, under names that do not look like two answers to one question."""
    tiles, bag = tmp_path / "tiles.h5", tmp_path / "bag.h5"
    _write_old_tile_file(tiles)
    with h5py.File(tiles, "a") as h5:  # a newer file: two tissue tiles rejected as marker ink
        h5.attrs["n_ink"] = 2
        h5.attrs["n_tissue"] = int(h5.attrs["n_tissue"]) + 2
        h5.attrs["n_grid"] = int(h5.attrs["n_grid"]) + 2
    _write_old_bag(bag)
    result = CliRunner().invoke(cli, ["info", str(tiles), str(bag)])
    assert result.exit_code == 0, result.output
    shown = dict(line.split(None, 1) for line in result.output.splitlines() if line.strip())
    assert shown["n_ink"] == "2" and shown["n_kept"] == str(N)
    for name in ("n_background", "n_blurry", "n_unreadable", "n_fold", "n_bubble", "n_border", "n_dust"):
        assert name in shown, name
    assert shown["stored_as"] == "float16" and shown["computed_in"] == "bf16"
    assert "dtype" not in shown and "precision" not in shown

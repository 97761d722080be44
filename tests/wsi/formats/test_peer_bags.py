"""Bags round-trip with the peers: ours carry every attribute STAMP's readers require, and bags written
the way STAMP, CLAM and TRIDENT write them load, train and predict here (issue 10 item 7).

The writers and STAMP's checks live in tests/helpers/peer_bags.py, each citing the peer's file and lines.
Beyond these tests, ours were run through STAMP 2.5.0's own `detect_feature_type`, `get_coords` and
`BagDataset` (see the report of issue 10); the restated checks below must agree with what that run saw:
our old bags refused ("Unknown feature type: None"), bytes `feat_type` refused, new ones accepted.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from cohorts import TINY, write_task
from peer_bags import (
    StampRefusal,
    TridentGeometry,
    class_feats,
    grid_coords,
    stamp_feature_type,
    stamp_reads,
    write_clam_bag,
    write_cohort,
    write_stamp_bag,
    write_trident_bag,
)

from wsi.cli.main import cli
from wsi.core.errors import BagFormatError
from wsi.formats.bags import BagProvenance, read_bag, write_bag
from wsi.pipelines.inputs import Item
from wsi.pipelines.inputs.bags import BagInput

MPP = 0.5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _our_bag(path: Path, n: int = 9) -> tuple[np.ndarray, np.ndarray]:
    feats = class_feats(np.random.default_rng(0), n, 1)
    coords_px = grid_coords(n, 512)
    coords_um = (coords_px * MPP).astype(np.float32)
    provenance = BagProvenance(
        slide_id=path.stem, encoder="timm:resnet18", weights_sha256="ab" * 32, tile_um=256.0,
        tile_px=224, mpp=MPP, level0_width=5000, level0_height=4000, tile_params={"tile_um": 256.0},
    )  # fmt: skip
    write_bag(path, feats=feats, coords_um=coords_um, coords_px=coords_px, provenance=provenance)
    return feats, coords_um


# ------------------------------------------------------------------------------ ours, read by STAMP
def test_our_bags_carry_every_attribute_stamp_requires(tmp_path: Path) -> None:
    """STAMP's minimum for a tile bag (data.py:424-457, 584-655, 741-808), item by item."""
    folder = tmp_path / "features" / "timm-resnet18"
    feats, coords_um = _our_bag(folder / "s1.h5")
    (folder / "manifest.csv").write_text("slide,path,status\n")  # not an .h5: STAMP never opens it
    with h5py.File(folder / "s1.h5", "r") as h5:
        feat_type = h5.attrs["feat_type"]
        # a Python str (h5py: variable-length UTF-8), not bytes: STAMP refuses str(b"tile"), "b'tile'"
        assert type(feat_type) is str and feat_type == "tile"
        assert h5py.check_string_dtype(h5.attrs.get_id("feat_type").dtype).encoding == "utf-8"
        assert type(h5.attrs["unit"]) is str and h5.attrs["unit"] == "um"
        assert h5["feats"].ndim == 2 and h5["feats"].dtype.kind == "f"  # read whole, then .float()
        assert h5["coords"].dtype == np.float32 and h5["coords"].shape == (len(feats), 2)  # um, top-left
        assert float(h5.attrs["tile_size_um"]) == 256.0  # rule b of get_coords: truthy tile_size_um
        assert int(h5.attrs["tile_size_px"]) == 224  # read with int() when present (:800-801)
        assert "stamp_version" not in h5.attrs  # a version newer than the user's STAMP is refused
        assert isinstance(h5.get("feats", getlink=True), h5py.HardLink)  # `feats` is a real dataset
    assert stamp_feature_type(folder) == "tile"
    read = stamp_reads(folder / "s1.h5")
    np.testing.assert_allclose(read["feats"], feats, atol=1e-2)  # float16 storage
    np.testing.assert_array_equal(read["coords_um"], coords_um)
    assert read["tile_size_um"] == 256.0


def test_a_run_folder_with_tile_files_is_still_one_feature_type_for_stamp(tmp_path: Path) -> None:
    """STAMP rglobs every .h5 under the folder it is given: our tile files count as "tile" too."""
    from wsi.formats.tile_file import write_tile_file
    from wsi.formats.tile_meta import TileFileMeta

    _our_bag(tmp_path / "features" / "timm-resnet18" / "s1.h5")
    coords = grid_coords(3, 512)
    write_tile_file(
        tmp_path / "tiles" / "s1.h5", coords=coords, coords_um=(coords * MPP).astype(np.float32),
        meta=TileFileMeta.from_attrs(
            {"slide_id": "s1", "slide_path": "/x/s1.svs", "tile_size_um": 256.0, "tile_size_px": 224,
             "mpp": MPP, "target_mpp": 256 / 224, "level0_width": 5000, "level0_height": 4000,
             "backend": "openslide", "vendor": "aperio", "params": json.dumps({"tile_um": 256.0}),
             "n_grid": 9, "n_tissue": 3, "n_background": 0, "n_blurry": 0, "n_kept": 3,
             "wsi_version": "0"}, source="test",
        ),
    )  # fmt: skip
    assert stamp_feature_type(tmp_path) == "tile"


def test_the_restated_checks_refuse_what_stamp_refused(tmp_path: Path) -> None:
    """Controls: the bags STAMP 2.5.0 itself refused are refused here, for the same reasons."""
    old = tmp_path / "old"
    _our_bag(old / "s1.h5")
    with h5py.File(old / "s1.h5", "a") as h5:  # our bags before issue 10: `encoder`, no `feat_type`
        del h5.attrs["feat_type"]
    with pytest.raises(StampRefusal, match="Unknown feature type: None"):
        stamp_feature_type(old)
    as_bytes = tmp_path / "bytes"
    _our_bag(as_bytes / "s1.h5")
    with h5py.File(as_bytes / "s1.h5", "a") as h5:
        h5.attrs["feat_type"] = np.bytes_(b"tile")  # fixed-length ASCII reads back as bytes
    with pytest.raises(StampRefusal, match="b'tile'"):
        stamp_feature_type(as_bytes)
    newer = tmp_path / "newer.h5"
    _our_bag(newer)
    with h5py.File(newer, "a") as h5:
        h5.attrs["stamp_version"] = "9.0"
    with pytest.raises(StampRefusal, match="newer version"):
        stamp_reads(newer)
    # a CLAM bag on a 224 px grid passes get_coords as "historic STAMP" (silently), then fails on its
    # features: STAMP never reads `features`
    clam = write_clam_bag(tmp_path / "clam.h5", np.ones((12, 4)), grid_coords(12, 224))
    with pytest.raises(StampRefusal, match="patch_embeddings"):
        stamp_reads(clam)


# ---------------------------------------------------------------------------- the peers', read here
def test_a_stamp_bag_loads_in_micrometres(tmp_path: Path) -> None:
    feats = class_feats(np.random.default_rng(1), 7, 0)
    coords_um = grid_coords(7, 512) * MPP
    path = write_stamp_bag(tmp_path / "s.h5", feats, coords_um)
    assert stamp_reads(path)["tile_size_um"] == 256.0  # the writer is right by STAMP's own rules
    sample = BagInput().dataset([Item("s", path, 0)], train=False)[0]
    np.testing.assert_allclose(sample["x"].float().numpy(), feats, atol=1e-2)
    np.testing.assert_array_equal(sample["coords_um"].numpy(), coords_um)
    assert sample["tile_um"] == 256.0 and read_bag(path).meta["layout"] == "stamp"


def test_a_clam_bag_loads_with_the_grid_as_tile_size(tmp_path: Path) -> None:
    feats = class_feats(np.random.default_rng(2), 7, 1)
    coords_px = grid_coords(7, 256)
    path = write_clam_bag(tmp_path / "c.h5", feats, coords_px)
    with h5py.File(path) as h5:  # exactly CLAM's save_hdf5 output: no attributes anywhere
        assert not h5.attrs and not h5["features"].attrs and not h5["coords"].attrs
        assert h5["coords"].dtype == np.int32 and h5["features"].chunks == (32, 16)
    item = [Item("c", path, 0)]
    with_mpp = BagInput(mpp=MPP).dataset(item, train=False)[0]
    np.testing.assert_array_equal(with_mpp["x"].numpy(), feats)
    np.testing.assert_allclose(with_mpp["coords_um"].numpy(), coords_px * MPP)
    assert with_mpp["tile_um"] == 256 * MPP  # the 256 px grid step at 0.5 um/px
    no_mpp = BagInput(uses_positions=False).dataset(item, train=False)[0]  # no positions: no mpp needed
    assert "coords_um" not in no_mpp and no_mpp["tile_px0"] == 256


def test_a_trident_bag_loads_with_its_nominal_mpp(tmp_path: Path) -> None:
    feats = class_feats(np.random.default_rng(3), 7, 1)
    g = TridentGeometry()  # 40x level 0, 256 px at 20x: 512 level-0 px, 10 / 40 = 0.25 um/px
    coords_px = grid_coords(7, g.patch_size_level0)
    path = write_trident_bag(tmp_path / "t.h5", feats, coords_px, g)
    sample = BagInput().dataset([Item("t", path, 0)], train=False)[0]
    np.testing.assert_array_equal(sample["x"].numpy(), feats)
    np.testing.assert_allclose(sample["coords_um"].numpy(), coords_px * 0.25)
    assert sample["tile_um"] == 512 * 0.25 == 128.0
    real = BagInput(mpp_by_slide={"t": 0.26}).dataset([Item("t", path, 0)], train=False)[0]
    assert real["tile_um"] == pytest.approx(512 * 0.26)  # a real mpp beats the nominal one


def test_a_peer_bag_attribute_that_is_no_number_is_named(tmp_path: Path) -> None:
    """Foreign attributes are free-form: one that should be a number and is text is refused by name."""
    feats = class_feats(np.random.default_rng(4), 3, 0)
    path = write_trident_bag(tmp_path / "t.h5", feats, grid_coords(3, 512), TridentGeometry())
    with h5py.File(path, "a") as h5:
        h5["coords"].attrs["patch_size_level0"] = "five hundred"
    with pytest.raises(BagFormatError, match=r"t\.h5 \(trident layout\): attribute `patch_size_level0` is "):
        read_bag(path, mpp=0.25)


# ------------------------------------------------------------------------ wsi train / wsi predict
def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("layout", ["stamp", "clam", "trident"])
def test_wsi_train_and_predict_accept_each_peer_layout(layout: str, tmp_path: Path) -> None:
    bags, labels = write_cohort(tmp_path, layout, n_slides=10)
    # CLAM bags carry no resolution: the run gives it (a task's input_options.mpp, as --mpp will)
    options = {"mpp": MPP} if layout == "clam" else {}
    task = write_task(
        tmp_path / "task.yaml", epochs=2, input_options=options,
        model={"preset": "vit-wsi", "attention": "seqnorm", "overrides": dict(TINY)},
    )  # fmt: skip
    runner = CliRunner()
    run = tmp_path / "run"
    res = runner.invoke(
        cli, ["train", "--task", str(task), "--features", str(bags), "--labels", str(labels), "--out",
              str(run), "--no-progress"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = tmp_path / "preds"
    res = runner.invoke(
        cli, ["predict", "--model", str(run), "--features", str(bags), "--out", str(out), "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    rows = _rows(out / "predictions.csv")
    assert sorted(r["slide"] for r in rows) == [f"slide-{k:02d}" for k in range(10)]
    for row in rows:
        probs = [float(row["prob_LUAD"]), float(row["prob_LUSC"])]
        assert all(math.isfinite(p) for p in probs) and sum(probs) == pytest.approx(1.0, abs=1e-5)
    assert {r["status"] for r in _rows(out / "manifest.csv")} == {"ok"}

"""Bags that would poison a model are refused by name; the bag adapter resolves each slide's mpp in the
documented order and needs none when the model uses no tile positions."""

from __future__ import annotations

import csv
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from wsi.core.errors import BagFormatError, ConfigError
from wsi.formats.bags import NonFiniteFeaturesError, check_finite, find_bad_bags, read_bag, scan_bag
from wsi.pipelines.inputs import Item
from wsi.pipelines.inputs.bag_dataset import collate_bags
from wsi.pipelines.inputs.bags import BagInput

TILE_PX0 = 512


def _clam(path: Path, feats: np.ndarray | None = None, n: int = 6) -> Path:
    """A feature bag as CLAM writes it: `features` + int32 level-0 px `coords`, no attributes."""
    feats = np.random.default_rng(1).normal(size=(n, 8)).astype(np.float32) if feats is None else feats
    coords = np.stack([np.arange(len(feats)) * TILE_PX0, np.zeros(len(feats))], axis=1).astype(np.int32)
    with h5py.File(path, "w") as h5:
        h5["features"] = feats
        h5["coords"] = coords
    return path


def _trident(path: Path, magnification: int = 20) -> Path:
    _clam(path)
    with h5py.File(path, "a") as h5:
        h5["coords"].attrs.update(patch_size_level0=TILE_PX0, level0_magnification=magnification)
    return path


def _nan_feats(n: int = 6, bad_rows: tuple[int, ...] = (4,), value: float = np.nan) -> np.ndarray:
    feats = np.ones((n, 8), np.float32)
    for r in bad_rows:
        feats[r, 3] = value
    return feats


def test_check_finite_names_the_bag_and_the_count(tmp_path: Path) -> None:
    path = _clam(tmp_path / "s1.h5", _nan_feats(bad_rows=(1, 4)))
    bag = read_bag(path, mpp=0.5)
    with pytest.raises(NonFiniteFeaturesError, match=r"2 of 6 tiles") as err:
        check_finite(bag)
    assert str(path) in str(err.value) and isinstance(err.value, BagFormatError)
    check_finite(read_bag(_clam(tmp_path / "ok.h5"), mpp=0.5))  # a clean bag passes


def test_find_bad_bags_lists_every_bad_bag_reading_in_small_blocks(tmp_path: Path) -> None:
    good = _clam(tmp_path / "good.h5", n=50)
    late_nan = _clam(tmp_path / "late.h5", _nan_feats(n=50, bad_rows=(49,)))  # in the last block only
    inf = _clam(tmp_path / "inf.h5", _nan_feats(bad_rows=(0, 1, 2), value=np.inf))
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not an hdf5 file")
    empty = tmp_path / "empty.h5"
    with h5py.File(empty, "w") as h5:
        h5["features"] = np.zeros((0,), np.float32)
        h5["coords"] = np.zeros((0, 2), np.int64)
    bad = find_bad_bags([good, late_nan, inf, junk, empty], max_block_bytes=8 * 4 * 3)  # 3 rows a block
    assert [b.path for b in bad] == [late_nan, inf, junk, empty]
    assert (bad[0].n_nonfinite, bad[0].n_rows) == (1, 50) and (bad[1].n_nonfinite, bad[1].n_rows) == (3, 6)
    assert all(str(b.path) in b.reason for b in bad)
    assert "no tiles" in bad[3].reason
    assert scan_bag(good) is None


def test_the_adapter_refuses_a_non_finite_bag_by_name(tmp_path: Path) -> None:
    items = [
        Item("a", _clam(tmp_path / "a.h5"), label=0),
        Item("b", _clam(tmp_path / "b.h5", _nan_feats()), label=1),
    ]
    adapter = BagInput(mpp=0.5)
    assert [(it.id, "1 of 6 tiles" in why) for it, why in adapter.bad_items(items)] == [("b", True)]
    ds = adapter.dataset(items, train=False)
    assert ds[0]["x"].shape == (6, 8)
    with pytest.raises(NonFiniteFeaturesError, match=r"b\.h5"):
        ds[1]
    with pytest.raises(NonFiniteFeaturesError):  # subsampled training bags are checked too
        BagInput(mpp=0.5, bag_size=6).dataset(items, train=True)[1]


def test_mpp_order_slide_column_then_run_wide_then_the_bag(tmp_path: Path) -> None:
    items = [Item(s, _trident(tmp_path / f"{s}.h5"), label=0) for s in ("s1", "s2", "s3")]
    # TRIDENT's own 20x says 0.5; --mpp says 0.4; the labels CSV says 0.25 for s1
    ds = BagInput(mpp=0.4, mpp_by_slide={"s1": 0.25}).dataset(items, train=False)
    assert ds[0]["coords_um"][1, 0].item() == TILE_PX0 * 0.25 and ds[0]["tile_um"] == TILE_PX0 * 0.25
    assert ds[1]["coords_um"][1, 0].item() == pytest.approx(TILE_PX0 * 0.4)
    bag_only = BagInput().dataset(items, train=False)[2]
    assert bag_only["coords_um"][1, 0].item() == TILE_PX0 * 0.5 and bag_only["tile_um"] == TILE_PX0 * 0.5
    adapter = BagInput().with_resolution(mpp=0.4, mpp_by_slide={"s3": 0.3})
    assert adapter.dataset(items, train=False)[2]["coords_um"][1, 0].item() == pytest.approx(TILE_PX0 * 0.3)


def test_bags_in_pixels_need_no_mpp_when_the_model_uses_no_positions(tmp_path: Path) -> None:
    items = [
        Item("c1", _clam(tmp_path / "c1.h5"), label=0),
        Item("c2", _clam(tmp_path / "c2.h5", n=4), label=1),
    ]
    with pytest.raises(BagFormatError, match=r"--mpp") as err:  # positions used: refused, fix named
        BagInput().dataset(items, train=False)[0]
    assert "c1.h5" in str(err.value) and "`mpp` column" in str(err.value)
    ds = BagInput(uses_positions=False).dataset(items, train=False)
    sample = ds[0]
    assert "coords_um" not in sample and sample["tile_px0"] == TILE_PX0
    assert sample["coords_px"][1].tolist() == [TILE_PX0, 0]
    batch = collate_bags([ds[0], ds[1]])
    assert batch.x.shape == (2, 6, 8) and set(batch.model_inputs()) == {"mask"}  # no made-up micrometres
    assert set(collate_bags([ds[0]]).model_inputs()) == set()


def test_bad_mpp_values_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="mpp"):
        BagInput(mpp=-1.0)
    with pytest.raises(ConfigError, match="'s1'"):
        BagInput(mpp_by_slide={"s1": float("nan")})


def test_heatmap_of_a_bag_in_pixels(tmp_path: Path) -> None:
    items = [Item("c1", _clam(tmp_path / "c1.h5"), label=0)]
    adapter = BagInput(uses_positions=False)
    sample = adapter.dataset(items, train=False)[0]
    png = tmp_path / "c1.png"
    adapter.heatmap(items[0], sample, torch.linspace(-1, 1, 6), png, title="c1")
    assert png.is_file() and png.stat().st_size > 0


def test_predict_fails_the_non_finite_slide_and_goes_on(tmp_path: Path) -> None:
    from cohorts import make_bag, make_cohort, write_task

    from wsi.pipelines.predict.stage import predict
    from wsi.pipelines.train import train

    torch.set_num_threads(1)
    cohort = make_cohort(tmp_path, n_patients=6)
    run = train(
        task=write_task(tmp_path / "task.yaml", epochs=1), labels_csv=cohort.labels,
        features_dir=cohort.bags, out_dir=tmp_path / "run", progress=False,
    ).run_dir  # fmt: skip
    bags = tmp_path / "new"
    bags.mkdir()
    for slide in cohort.slides[:2]:
        (bags / f"{slide}.h5").write_bytes((cohort.bags / f"{slide}.h5").read_bytes())
    make_bag(bags / "nan-slide.h5", label=0, rng=np.random.default_rng(0), n=5)
    with h5py.File(bags / "nan-slide.h5", "a") as h5:
        h5["feats"][2, 0] = np.nan
    result = predict(model_dir=run, features_dir=bags, out_dir=tmp_path / "out", progress=False)
    status = {r.slide_id: r for r in result.results}
    assert status["nan-slide"].status == "failed" and "1 of 5 tiles" in status["nan-slide"].error
    assert "nan-slide.h5" in status["nan-slide"].error
    assert [status[s].status for s in cohort.slides[:2]] == ["ok", "ok"]
    assert sorted(row["slide"] for row in result.rows) == sorted(cohort.slides[:2])  # no prob=nan row
    # and so say the files: the slide failed in the manifest, no row for it in predictions.csv
    with (tmp_path / "out" / "manifest.csv").open() as fh:
        manifest = {row["slide"]: row["status"] for row in csv.DictReader(fh)}
    assert manifest == {"nan-slide": "failed", **{s: "ok" for s in cohort.slides[:2]}}
    with (tmp_path / "out" / "predictions.csv").open() as fh:
        assert sorted(row["slide"] for row in csv.DictReader(fh)) == sorted(cohort.slides[:2])

"""Bags embedded with another stain normalisation than the run's training bags are refused before
prediction (a model fed raw-tile features after training on normalised ones answers wrongly, exit 0)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wsi.core.errors import ConfigError
from wsi.formats.bags import BagProvenance, write_bag
from wsi.pipelines.inputs import Item
from wsi.pipelines.inputs.bags import BagInput

SHA = "a" * 64


def _bag(path: Path, stain: str | None, ref: str | None) -> Item:
    rng = np.random.default_rng(0)
    coords = np.stack([np.arange(6) % 3, np.arange(6) // 3], 1).astype(np.float32) * 256.0
    prov = BagProvenance(
        slide_id=path.stem, encoder="test-encoder", weights_sha256=SHA, tile_um=256.0, tile_px=256,
        mpp=0.5, level0_width=2048, level0_height=2048, tile_params={"tile_um": 256.0, "tile_px": 256},
        stain_norm=stain, stain_reference_sha256=ref,
    )  # fmt: skip
    feats = rng.normal(size=(6, 8)).astype(np.float32)
    write_bag(path, feats=feats, coords_um=coords, coords_px=(coords / 0.5).astype(np.int64), provenance=prov)
    return Item(id=path.stem, path=path)


def test_the_run_records_its_stain_normalisation_and_refuses_other_bags(tmp_path: Path) -> None:
    adapter = BagInput()
    trained = [_bag(tmp_path / f"t{i}.h5", "reinhard", "r" * 64) for i in range(2)]
    prov = adapter.provenance(trained)
    assert (prov["stain_norm"], prov["stain_reference_sha256"]) == ("reinhard", "r" * 64)
    adapter.check_compatible(prov, [_bag(tmp_path / "same.h5", "reinhard", "r" * 64)])  # accepted
    raw = _bag(tmp_path / "raw.h5", None, None)
    refused = r"stain normalisation reinhard.*raw\.h5 \(none.*--stain-norm reinhard"
    with pytest.raises(ConfigError, match=refused):
        adapter.check_compatible(prov, [raw])
    other_ref = _bag(tmp_path / "other.h5", "reinhard", "s" * 64)
    with pytest.raises(ConfigError, match=r"other\.h5 \(reinhard, reference ssss"):
        adapter.check_compatible(prov, [other_ref])


def test_a_run_without_stain_normalisation_refuses_normalised_bags(tmp_path: Path) -> None:
    adapter = BagInput()
    prov = adapter.provenance([_bag(tmp_path / "t.h5", None, None)])
    assert prov["stain_norm"] is None
    adapter.check_compatible(prov, [_bag(tmp_path / "plain.h5", None, None)])
    with pytest.raises(ConfigError, match="stain normalisation none"):
        adapter.check_compatible(prov, [_bag(tmp_path / "macenko.h5", "macenko", "m" * 64)])


def test_runs_recorded_before_the_stain_fields_are_not_checked(tmp_path: Path) -> None:
    old = {"encoder": "test-encoder", "weights_sha256": SHA}  # a config.json of an earlier version
    BagInput().check_compatible(old, [_bag(tmp_path / "macenko.h5", "macenko", "m" * 64)])


def test_raw_slides_of_a_stain_normalised_run_are_refused_before_any_work(tmp_path: Path) -> None:
    from wsi.pipelines.predict.config import PredictOptions
    from wsi.pipelines.predict.raw_slides import embed_raw_slides

    prov = {"encoder": "test-encoder", "weights_sha256": SHA, "tile_params": {"tile_um": 256.0},
            "stain_norm": "macenko", "stain_reference_sha256": "m" * 64}  # fmt: skip
    with pytest.raises(ConfigError, match=r"stain-normalised tiles \(macenko\).*--stain-norm macenko"):
        embed_raw_slides(
            prov, [tmp_path / "missing.svs"], tmp_path / "work", PredictOptions(device="cpu", progress=False)
        )
    assert not (tmp_path / "work").exists()

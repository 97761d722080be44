"""A folder given as bags that holds none: the run folder, its features/ folder (several encoders) or
its tiles/ folder (tile files, not bags) are named with the folder to give instead."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from cohorts import make_bag

from wsi.cli.main import cli
from wsi.formats.bags import bag_folders_below, no_bags_message
from wsi.formats.bags.folders import tile_files_message


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run folder as `wsi tile` + `wsi embed` with two encoders leave it (tile files: format only)."""
    root = tmp_path / "run"
    (root / "tiles").mkdir(parents=True)
    for slide in ("a", "b"):
        with h5py.File(root / "tiles" / f"{slide}.h5", "w") as h5:
            h5.attrs["format"] = "wsi-tiles"
        for encoder in ("enc-1", "enc-2"):
            (root / "features" / encoder).mkdir(parents=True, exist_ok=True)
            make_bag(root / "features" / encoder / f"{slide}.h5", label=0, rng=np.random.default_rng(0), n=4)
    (root / "qc").mkdir()
    return root


def test_bag_folders_below_leave_out_tile_files(run: Path) -> None:
    features = run / "features"
    assert bag_folders_below(run) == [features / "enc-1", features / "enc-2"]
    assert bag_folders_below(features) == [features / "enc-1", features / "enc-2"]
    assert bag_folders_below(run / "qc") == []
    message = no_bags_message(features)
    below = f"{features / 'enc-1'}, {features / 'enc-2'}"
    assert f"in {features} itself; bag folders below it: {below}" in message
    assert f"{run / 'tiles'}" not in no_bags_message(run)
    assert "give the folder `wsi embed` wrote" in no_bags_message(run / "qc")


def test_tile_files_are_told_from_bags(run: Path) -> None:
    message = tile_files_message(run / "tiles")
    assert message is not None and "holds tile files" in message
    assert f"wsi embed --tiles {run} --out {run}" in message
    assert tile_files_message(run / "features" / "enc-1") is None


def test_train_names_the_folder_to_give(run: Path, tmp_path: Path) -> None:
    labels = tmp_path / "labels.csv"
    labels.write_text("slide,label\na,LUAD\nb,LUSC\n")
    for features, expected in ((run / "tiles", "holds tile files"), (run, "bag folders below it")):
        res = CliRunner().invoke(cli, ["train", "--task", "nsclc-subtype", "--features", str(features),
                                       "--labels", str(labels), "--out", str(tmp_path / "m")])  # fmt: skip
        assert res.exit_code == 2 and expected in res.output, res.output
        assert "Traceback" not in res.output

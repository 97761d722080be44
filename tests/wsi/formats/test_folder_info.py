"""`wsi info FOLDER`: a folder of bags or tile files, or a run folder, from attributes and shapes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from tests.helpers.peer_bags import write_clam_bag, write_stamp_bag
from wsi.cli.main import cli
from wsi.formats.bags import BagProvenance, write_bag
from wsi.formats.folder_info import FolderSummary, RunSummary, folder_info
from wsi.formats.tile_file import write_tile_file
from wsi.formats.tile_meta import REQUIRED_ATTRS, TileFileMeta

MANIFEST_HEADER = ["slide", "path", "status", "tiles", "seconds", "error", "note"]


def our_bag(path: Path, n: int, *, dim: int = 8, encoder: str = "retccl", nan: bool = False) -> Path:
    if n == 0:  # write_bag writes no empty bag (embed records the slide as empty): a peer or a hand might
        with h5py.File(our_bag(path, 1, dim=dim, encoder=encoder), "r+") as h5:
            for name in ("feats", "coords", "coords_px"):
                data = h5[name][()][:0]
                del h5[name]
                h5[name] = data
        return path
    feats = np.random.default_rng(n).normal(size=(n, dim)).astype(np.float32)
    xy = np.stack([np.arange(n) % 10, np.arange(n) // 10], axis=1).astype(np.float32) * 256.0
    prov = BagProvenance(
        slide_id=path.stem, encoder=encoder, weights_sha256="0" * 64, tile_um=256.0, tile_px=224,
        mpp=0.5, level0_width=8192, level0_height=8192, tile_params={},
    )  # fmt: skip
    write_bag(path, feats=feats, coords_um=xy, coords_px=np.round(xy / 0.5).astype(np.int64), provenance=prov)
    if nan:  # write_bag refuses non-finite features: poke one in afterwards, as a damaged file would hold
        with h5py.File(path, "r+") as h5:
            h5["feats"][0, 0] = np.nan
    return path


def tile_file(path: Path, n: int, *, tile_um: float = 256.0, tile_px: int = 224) -> Path:
    attrs: dict[str, object] = {name: 0 for name in REQUIRED_ATTRS}
    attrs.update(
        slide_id=path.stem, slide_path=f"/slides/{path.stem}.svs", tile_um=tile_um, tile_px=tile_px,
        mpp=0.5, target_mpp=tile_um / tile_px, level0_width=8192, level0_height=8192, backend="openslide",
        vendor="aperio", params={}, n_kept=n, wsi_version="test",
    )  # fmt: skip
    xy = np.stack([np.arange(n), np.zeros(n)], axis=1).astype(np.float32) * tile_um
    meta = TileFileMeta.from_attrs(attrs, source="test")
    write_tile_file(path, coords=np.round(xy / 0.5), coords_um=xy, meta=meta)
    return path


def manifest(folder: Path, rows: list[list[object]]) -> None:
    with (folder / "manifest.csv").open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([MANIFEST_HEADER, *rows])


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """RUN/tiles: 3 tile files (5, 0, 7 tiles) + manifest; RUN/features/retccl: 3 bags (4, 10, 0 tiles),
    manifest with one failed slide."""
    tiles, bags = tmp_path / "run" / "tiles", tmp_path / "run" / "features" / "retccl"
    tiles.mkdir(parents=True)
    bags.mkdir(parents=True)
    for name, n in (("a", 5), ("b", 0), ("c", 7)):
        tile_file(tiles / f"{name}.h5", n)
    manifest(tiles, [["a", "/s/a.svs", "ok", 5, 1, "", ""], ["b", "/s/b.svs", "empty", 0, 1, "", ""],
                     ["c", "/s/c.svs", "ok", 7, 1, "", ""]])  # fmt: skip
    for name, n in (("a", 4), ("c", 10), ("d", 0)):
        our_bag(bags / f"{name}.h5", n)
    manifest(bags, [["a", "/s/a.svs", "ok", 4, 1, "", ""], ["c", "/s/c.svs", "skipped", 10, 0, "", ""],
                    ["e", "/s/e.svs", "failed", 0, 1, "SlideError: e.svs cannot be opened", ""]])  # fmt: skip
    return tmp_path / "run"


def test_a_bag_folder_says_encoder_width_tiles_unusable_and_manifest(run: Path) -> None:
    bags = run / "features" / "retccl"
    summary = folder_info(bags)
    assert isinstance(summary, FolderSummary) and summary.kind == "feature bags" and summary.files == 3
    assert summary.bags is not None and not summary.bags.mixed
    [group] = summary.bags.encoders
    assert (group.encoder, group.layout, group.dim, group.dtype, group.bags) == (
        "retccl",
        "wsi",
        8,
        "float16",
        3,
    )
    assert summary.bags.tiles is not None
    assert (summary.bags.tiles.total, summary.bags.tiles.min, summary.bags.tiles.median) == (14, 0, 4)
    assert summary.bags.tiles.max == 10 and summary.bags.empty == 1
    assert [b.path.name for b in summary.unusable] == ["d.h5"] and "holds no tiles" in summary.unusable[
        0
    ].reason
    assert summary.manifest is not None and summary.manifest.status == {"ok": 1, "skipped": 1, "failed": 1}
    assert summary.manifest.failed == [("e", "SlideError: e.svs cannot be opened")]

    res = CliRunner().invoke(cli, ["info", str(bags)])
    assert res.exit_code == 1, res.output  # an empty bag: wsi train and predict refuse it
    lines = res.output.splitlines()
    assert "bags      3; retccl (wsi, 8 features, float16): 3" in lines
    assert "tiles     14 in all; per slide min 0 / median 4 / max 10; 1 with no tiles" in lines
    assert any(line.startswith("usable    2 of 3; 1 refused") for line in lines)
    assert any("d.h5 holds no tiles" in line for line in lines)
    assert f"manifest  {bags / 'manifest.csv'}: 3 slides; ok 1, skipped 1, failed 1" in lines
    assert "            failed e: SlideError: e.svs cannot be opened" in lines
    assert "1 of 3 bag(s) would be refused by the next command" in res.output

    res = CliRunner().invoke(cli, ["info", str(bags), "--json"])
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["kind"] == "feature bags" and data["bags"]["encoders"][0]["dim"] == 8
    assert data["bags"]["mixed"] is False and data["bags"]["tiles"] == {
        "total": 14,
        "min": 0,
        "median": 4.0,
        "max": 10,
    }
    assert data["manifest"]["status"] == {"ok": 1, "skipped": 1, "failed": 1}
    assert [Path(u["path"]).name for u in data["unusable"]] == ["d.h5"]


def test_a_tile_folder_says_tile_size_and_counts(run: Path) -> None:
    res = CliRunner().invoke(cli, ["info", str(run / "tiles")])
    assert res.exit_code == 0, res.output  # an empty tile file is a slide without tissue, not a broken file
    lines = res.output.splitlines()
    assert "kind        tile files" in lines
    assert "tile files  3; 256 um / 224 px: 3" in lines
    assert "tiles       12 in all; per slide min 0 / median 5 / max 7; 1 with no tiles" in lines
    assert "usable      3 of 3" in lines
    assert any(line.startswith("manifest") and line.endswith("3 slides; ok 2, empty 1") for line in lines)


def test_info_json_names_the_tile_side_as_the_files_do(run: Path) -> None:
    """`wsi info --json` keeps the stored names (`tile_size_um`, `tile_size_px`) that scripts read, though
    the Python record calls them `tile_um` / `tile_px`."""
    res = CliRunner().invoke(cli, ["info", str(run / "tiles"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["tile_files"]["tile_sizes"] == [
        {"tile_size_um": 256.0, "tile_size_px": 224, "files": 3}
    ]
    group = folder_info(run / "tiles").tile_files.tile_sizes[0]  # type: ignore[union-attr]
    assert (group.tile_um, group.tile_px) == (256.0, 224)


def test_a_run_folder_summarises_tiles_and_each_encoder(run: Path) -> None:
    summary = folder_info(run)
    assert isinstance(summary, RunSummary)
    assert [Path(p.folder).relative_to(run).as_posix() for p in summary.parts] == ["tiles", "features/retccl"]
    assert len(summary.unusable) == 1
    res = CliRunner().invoke(cli, ["info", str(run), "--json"])
    data = json.loads(res.stdout)
    assert res.exit_code == 1 and data["kind"] == "run folder" and len(data["parts"]) == 2
    assert [p["kind"] for p in data["parts"]] == ["tile files", "feature bags"]
    res = CliRunner().invoke(cli, ["info", str(run / "features")])  # the features/ folder: each encoder
    assert res.exit_code == 1 and "kind    run folder: " + str(run / "features" / "retccl") in res.output


def test_mixed_encoders_peer_layouts_and_broken_files_are_named(tmp_path: Path) -> None:
    our_bag(tmp_path / "a.h5", 6, dim=8, encoder="retccl")
    our_bag(tmp_path / "b.h5", 3, dim=16, encoder="uni")
    write_stamp_bag(tmp_path / "c.h5", np.ones((2, 16)), np.zeros((2, 2)))
    write_clam_bag(tmp_path / "d.h5", np.ones((4, 32)), np.zeros((4, 2)))
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    res = CliRunner().invoke(cli, ["info", str(tmp_path)])
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    bags = next(line for line in lines if line.startswith("bags"))
    assert "5; MIXED encoders" in bags and "retccl (wsi, 8 features, float16): 1" in bags
    assert (
        "uni (wsi, 16 features, float16): 1" in bags and "ctranspath (stamp, 16 features, float16): 1" in bags
    )
    assert "unknown (clam, 32 features, float32): 1" in bags
    assert "manifest  none (no manifest.csv in this folder)" in lines
    assert any("junk.h5 is not a readable HDF5 bag" in line for line in lines)
    assert "usable    4 of 5; 1 refused" in res.output
    data = json.loads(CliRunner().invoke(cli, ["info", str(tmp_path), "--json"]).stdout)
    assert data["bags"]["mixed"] is True and len(data["bags"]["encoders"]) == 4


def test_nan_features_need_read_features(tmp_path: Path) -> None:
    our_bag(tmp_path / "a.h5", 5)
    our_bag(tmp_path / "nan.h5", 5, nan=True)
    quick = CliRunner().invoke(cli, ["info", str(tmp_path)])
    assert (
        quick.exit_code == 0 and "checked   attributes and shapes (--read-features: NaN too)" in quick.output
    )
    full = CliRunner().invoke(cli, ["info", str(tmp_path), "--read-features"])
    assert full.exit_code == 1 and "nan.h5: 1 of 5 tiles have NaN or infinite features" in full.output


def test_a_broken_tile_file_counts_as_unusable(tmp_path: Path) -> None:
    tile_file(tmp_path / "a.h5", 3)
    tile_file(tmp_path / "b.h5", 3, tile_um=112.0, tile_px=224)
    with h5py.File(tile_file(tmp_path / "c.h5", 2), "r+") as h5:
        h5.attrs["complete"] = False  # cut short
    res = CliRunner().invoke(cli, ["info", str(tmp_path)])
    assert res.exit_code == 1, res.output
    assert "tile files  3; MIXED tile sizes: 256 um / 224 px: 1, 112 um / 224 px: 1" in res.output
    assert "c.h5 is incomplete (interrupted write)" in res.output


def test_a_folder_with_nothing_of_ours_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    res = CliRunner().invoke(cli, ["info", str(tmp_path)])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output  # no traceback
    assert f"Error: {tmp_path} holds no tile files, feature bags (*.h5) or manifest.csv" in res.output
    assert "RUN/features/<encoder>" in res.output and "Traceback" not in res.output


def test_tile_files_and_bags_in_one_folder_are_both_summarised(tmp_path: Path) -> None:
    our_bag(tmp_path / "a.h5", 4)
    tile_file(tmp_path / "b.h5", 6)
    summary = folder_info(tmp_path)
    assert isinstance(summary, FolderSummary) and summary.kind == "tile files and feature bags"
    assert summary.bags is not None and summary.bags.count == 1 and summary.tile_files is not None
    assert summary.tile_files.count == 1 and summary.tile_files.tiles is not None
    assert summary.tile_files.tiles.total == 6 and not summary.unusable

"""The embed stage refuses what would silently replace or merge another slide's bag, fails a slide (not
the batch) whose id is unusable, reports bad tiles per slide, and checks --out before any work
(issue 10 items 2, 3, 8, 9)."""

from __future__ import annotations

import csv
import dataclasses
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.formats.bags import read_bag_attrs
from wsi.formats.tile_file import read_tile_file, write_tile_file
from wsi.pipelines.embed import EmbedOptions, embed_tiles
from wsi.pipelines.tile.stage import tile_slides
from wsi.slides.sources import find_slides
from wsi.tiling.params import TileParams

ENCODER = "timm:test_resnet"
OPTIONS = EmbedOptions(
    encoder=ENCODER, random_init=True, input_px=64, batch_size=8, readers=0, dtype="float32", threads=1
)
BAGS = "features/timm-test_resnet"
PARAMS = TileParams(tile_um=128.0, tile_px=32, min_blur_variance=0)
EMBED_ARGS = ["--encoder", ENCODER, "--random-init", "--input-px", "64", "--readers", "0"]


@pytest.fixture(scope="module")
def slides(make_slide) -> tuple[Path, Path]:
    a = make_slide(name="chk-a", size_um=600.0, mpp=1.0, seed=3)
    b = make_slide(name="chk-b", size_um=500.0, mpp=1.0, seed=4, style="b")
    return a.path, b.path


def _tile(paths: list[Path], out: Path) -> Path:
    results = tile_slides(find_slides(paths), out_dir=out, params=PARAMS, threads=1)
    assert all(r.status == "ok" for r in results), results
    return out


def _manifest(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as fh:
        return {row["slide"]: row for row in csv.DictReader(fh)}


def _as_other_slide(tile_file: Path, slide_path: Path) -> None:
    """Rewrite a tile file as if its slide id had been given to another slide file."""
    tf = read_tile_file(tile_file)
    write_tile_file(
        tile_file, coords=tf.coords, coords_um=tf.coords_um, meta=replace(tf.meta, slide_path=str(slide_path))
    )


def test_a_bag_of_another_slide_under_the_same_id_is_refused(
    slides: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = slides
    run = _tile([a], tmp_path / "run")
    assert [r.status for r in embed_tiles(tiles_dir=run, out_dir=run, options=OPTIONS, progress=False)] == [
        "ok"
    ]
    bag = run / BAGS / "chk-a.h5"
    before = bag.read_bytes()
    _as_other_slide(run / "tiles" / "chk-a.h5", b)  # same id, another slide file (which exists)
    with caplog.at_level(logging.WARNING):
        [row] = embed_tiles(tiles_dir=run, out_dir=run, options=OPTIONS, progress=False)
    assert (
        row.status == "failed" and str(a) in row.error and str(b) in row.error and "--overwrite" in row.error
    )
    assert str(a) in caplog.text and str(b) in caplog.text  # said at the default log level
    assert bag.read_bytes() == before  # nothing replaced
    assert _manifest(run / BAGS / "manifest.csv")["chk-a"]["status"] == "failed"
    again = dataclasses.replace(OPTIONS, overwrite=True)
    [row] = embed_tiles(tiles_dir=run, out_dir=run, options=again, progress=False)
    assert row.status == "ok" and read_bag_attrs(bag)["slide_path"] == str(b)


def test_a_moved_slide_is_the_same_slide(slides: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = slides
    moved = tmp_path / "moved" / a.name
    moved.parent.mkdir()
    shutil.copy(a, moved)
    run = _tile([moved], tmp_path / "run")
    assert [r.status for r in embed_tiles(tiles_dir=run, out_dir=run, options=OPTIONS, progress=False)] == [
        "ok"
    ]
    moved.unlink()  # the old file is gone and the new one has its size: the same slide, moved
    _as_other_slide(run / "tiles" / "chk-a.h5", a)
    assert [r.status for r in embed_tiles(tiles_dir=run, out_dir=run, options=OPTIONS, progress=False)] == [
        "skipped"  # same tiles, same encoder: its bag is still right
    ]


def test_ids_differing_only_by_case_are_refused(slides: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = slides
    run = _tile([a, b], tmp_path / "run")
    tiles = run / "tiles"
    tf = read_tile_file(tiles / "chk-b.h5")
    write_tile_file(
        tiles / "CHK-A.h5", coords=tf.coords, coords_um=tf.coords_um, meta=replace(tf.meta, slide_id="CHK-A")
    )
    (tiles / "chk-b.h5").unlink()
    rows = {r.slide_id: r for r in embed_tiles(tiles_dir=run, out_dir=run, options=OPTIONS, progress=False)}
    assert rows["CHK-A"].status == "ok"  # the first in order keeps the id
    assert rows["chk-a"].status == "failed" and "only by case" in rows["chk-a"].error
    assert "CHK-A.h5" in rows["chk-a"].error and "chk-a.h5" in rows["chk-a"].error
    assert not (run / BAGS / "chk-a.h5").exists()


def test_an_unusable_slide_id_fails_that_slide_only(slides: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = slides
    folder = tmp_path / "slides"
    folder.mkdir()
    shutil.copy(a, folder / "good.svs")
    shutil.copy(a, folder / "!!!.svs")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["-q", "embed", str(folder), "--out", str(out), *EMBED_ARGS,
                                   "--tile-um", "128", "--tile-px", "32"])  # fmt: skip
    assert res.exit_code == 1, res.output
    rows = _manifest(out / BAGS / "manifest.csv")
    assert rows["good"]["status"] == "ok"
    [bad] = [r for r in rows.values() if r["path"].endswith("!!!.svs")]
    assert bad["status"] == "failed" and "unusable slide id" in bad["error"]


def test_an_unwritable_out_is_a_usage_error_before_any_work(
    slides: tuple[Path, Path], tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = CliRunner().invoke(cli, ["embed", str(slides[0]), "--out", str(blocker / "run"), *EMBED_ARGS])
    assert res.exit_code == 2 and "--out" in res.output and "a-file" in res.output
    assert "Traceback" not in res.output


def test_the_summary_names_the_slides_with_bad_tiles(make_slide, tmp_path: Path) -> None:
    # as in test_embed: tiled on the intact slide, embedded from a copy with JPEG tile (3, 1) damaged
    clean = make_slide(name="emb-clean", size_um=640.0, mpp=0.5, seed=0)
    broken = make_slide(name="emb-broken", size_um=640.0, mpp=0.5, seed=0, corrupt_tiles=[(3, 1)])
    params = TileParams(tile_um=128.0, tile_px=256, min_blur_variance=0)
    run = tile_slides(find_slides([clean.path]), out_dir=tmp_path, params=params, threads=1)
    assert run[0].status == "ok"
    h5 = tmp_path / "tiles" / "emb-clean.h5"
    n = len(read_tile_file(h5))
    _as_other_slide(h5, broken.path)
    res = CliRunner().invoke(
        cli, ["embed", "--tiles", str(tmp_path), "--out", str(tmp_path / "o"), *EMBED_ARGS]
    )
    assert res.exit_code == 0, res.output
    assert f"emb-clean: 1 of {n} tiles unreadable, left out of its bag" in res.output


def test_a_rerun_gives_older_bags_stamps_feat_type(slides: tuple[Path, Path], tmp_path: Path) -> None:
    import h5py

    run = _tile([slides[0]], tmp_path / "run")
    embed_tiles(tiles_dir=run, out_dir=run, options=OPTIONS, progress=False)
    bag = run / BAGS / "chk-a.h5"
    with h5py.File(bag, "a") as h5:  # as written before issue 10
        del h5.attrs["feat_type"]
    [row] = embed_tiles(tiles_dir=run, out_dir=run, options=OPTIONS, progress=False)
    assert row.status == "skipped" and read_bag_attrs(bag)["feat_type"] == "tile"


def test_a_slide_that_kept_no_tile_is_an_empty_row_that_fails_the_run(
    slides: tuple[Path, Path], make_slide, tmp_path: Path
) -> None:
    """embed_slides carries the tile stage's `empty` row (it used to vanish from embed's and predict's
    results and the exit code was 0); `embed --tiles` says the same of an empty tile file."""
    from wsi.pipelines.embed import tile_and_embed
    from wsi.pipelines.scheduling.results import RunSummary

    tiny = make_slide(name="chk-tiny", size_um=100.0, mpp=1.0, seed=5)  # smaller than one 128 um tile
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["embed", str(slides[0]), str(tiny.path), "--out", str(out), *EMBED_ARGS,
                                   "--tile-um", "128", "--tile-px", "32"])  # fmt: skip
    assert res.exit_code == 1, res.output
    rows = _manifest(out / BAGS / "manifest.csv")
    assert rows["chk-a"]["status"] == "ok"
    assert rows["chk-tiny"]["status"] == "empty" and rows["chk-tiny"]["tiles"] == "0"
    assert rows["chk-tiny"]["error"].startswith("tiling kept no tile: ")
    assert "smaller than one tile" in rows["chk-tiny"]["error"]
    assert "1 empty" in res.output and "chk-tiny: tiling kept no tile" in res.output

    results = tile_and_embed(find_slides([slides[0], tiny.path]), out_dir=tmp_path / "lib", options=OPTIONS,
                           tile_params=PARAMS, progress=False)  # fmt: skip
    assert [(r.slide_id, r.status) for r in results] == [("chk-a", "ok"), ("chk-tiny", "empty")]
    assert [r.slide_id for r in RunSummary.of(results).problems] == ["chk-tiny"]

    # the tile file of the empty slide, embedded directly: an empty row with the tile stage's reason
    res = CliRunner().invoke(cli, ["embed", "--tiles", str(out), "--out", str(tmp_path / "o2"), *EMBED_ARGS])
    assert res.exit_code == 1, res.output
    row = _manifest(tmp_path / "o2" / BAGS / "manifest.csv")["chk-tiny"]
    assert row["status"] == "empty" and "smaller than one tile" in row["error"]

"""No silent failures in the tile stage (issue 10, items 2, 3 and 5): empty slides, mpp far from the
metadata, unusable and clashing slide ids, and an id already taken in --out by another slide file."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.formats.tile_file import is_complete, read_tile_file
from wsi.pipelines.scheduling.jobs import read_manifest
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.sources import SlideSource

WHOLE = [(0.0, 0.0, 1024.0, 1024.0)]  # tissue edge to edge: no sharp tissue/glass border anywhere


@pytest.fixture(scope="module")
def blurred(make_slide):
    """1 x 1 mm of H&E tissue, all of it out of focus (4 um Gaussian)."""
    return make_slide(name="all-blurred", size_um=1024.0, mpp=0.5, seed=4, tissue_boxes_um=WHOLE,
                      blur_boxes_um=WHOLE)  # fmt: skip


@pytest.fixture(scope="module")
def good(make_slide):
    return make_slide(name="good", size_um=1024.0, mpp=0.5, seed=5)


def _tile(*args: str):
    return CliRunner().invoke(cli, ["tile", *args], catch_exceptions=False)


def _rows(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "tiles" / "manifest.csv", newline="", encoding="utf-8") as fh:
        return {row["slide"]: row for row in csv.DictReader(fh)}


def test_all_blurry_slide_is_empty_not_ok_and_exit_is_non_zero(blurred, good, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = _tile(str(blurred.path), str(good.path), "--out", str(out))
    assert result.exit_code == 1, result.output
    rows = _rows(out)
    assert rows["all-blurred"]["status"] == "empty" and rows["all-blurred"]["tiles"] == "0"
    why = rows["all-blurred"]["error"]
    assert "16 tissue tiles rejected" in why and "blurry" in why and "--min-blur-var 50" in why
    assert rows["good"]["status"] == "ok" and int(rows["good"]["tiles"]) > 0  # the other slide is fine
    assert "1 empty" in result.stderr and "empty all-blurred: no tile kept" in result.stderr
    # the QC picture and a tile file (0 tiles, with the reason) are there to look at
    assert output_paths(out, "all-blurred").qc.is_file()
    assert read_tile_file(output_paths(out, "all-blurred").h5).meta.empty_reason == why

    # a re-run does not turn it into "already done": it is empty again, with the same reason
    again = _tile(str(blurred.path), "--out", str(out))
    assert again.exit_code == 1 and _rows(out)["all-blurred"]["status"] == "empty"
    assert "--min-blur-var" in again.stderr
    # the option the message names does fix it
    fixed = _tile(str(blurred.path), "--out", str(out), "--min-blur-var", "0")
    assert fixed.exit_code == 0, fixed.stderr
    assert _rows(out)["all-blurred"]["status"] == "ok" and int(_rows(out)["all-blurred"]["tiles"]) == 16


def test_empty_for_other_reasons_names_that_filter(good, tmp_path: Path) -> None:
    [r] = tile_slides([SlideSource("big-tiles", good.path)], out_dir=tmp_path,
                      params=_params(tile_um=2048.0, tile_px=64))  # fmt: skip
    assert r.status == "empty" and "smaller than one tile" in r.error and "--tile-um" in r.error
    [r] = tile_slides([SlideSource("strict", good.path)], out_dir=tmp_path,
                      params=_params(max_background_fraction=0.0))  # fmt: skip
    assert r.status == "empty" and "as background" in r.error and "--max-background 0" in r.error


def _params(**kwargs):
    from wsi.tiling.params import TileParams

    return TileParams(**kwargs)


def test_csv_mpp_ten_times_off_warns_at_the_default_log_level(good, tmp_path: Path) -> None:
    listing = tmp_path / "slides.csv"
    listing.write_text(f"path,mpp\n{good.path},5.0\n")
    result = _tile(str(listing), "--out", str(tmp_path / "run"))
    assert "slide's metadata says 0.5" in result.stderr and "mpp 5 um/px" in result.stderr
    assert "10.0x apart" in result.stderr
    # a fallback --mpp far from a slide's own metadata is not used for it, and says so
    result = _tile(str(good.path), "--out", str(tmp_path / "run2"), "--mpp", "5")
    assert result.exit_code == 0 and "--mpp 5 is not used for this slide" in result.stderr


def test_unicode_ids_kept_and_case_only_clash_refused_per_slide(good, tmp_path: Path) -> None:
    folder = tmp_path / "slides"
    folder.mkdir()
    for name in ("标本.svs", "Präparat ä.svs", "Präparat ö.svs", "Slide1.svs", "slide1.svs"):
        shutil.copy(good.path, folder / name)
    out = tmp_path / "run"
    result = _tile(str(folder), "--out", str(out))
    assert result.exit_code == 1 and "Traceback" not in result.output
    rows = _rows(out)
    assert rows["标本"]["status"] == "ok"
    umlauts = sorted(k for k in rows if k.startswith("Präparat"))
    assert len(umlauts) == 2 and umlauts[0] != umlauts[1]  # ä and ö stay apart
    assert all(rows[k]["status"] == "ok" for k in umlauts)
    assert rows["Slide1"]["status"] == "ok"
    assert rows["slide1"]["status"] == "failed"
    error = rows["slide1"]["error"]
    assert str(folder / "slide1.svs") in error and str(folder / "Slide1.svs") in error and "case" in error
    assert not output_paths(out, "slide1").h5.exists()


def test_same_id_from_another_slide_file_is_refused_naming_both(good, blurred, tmp_path: Path) -> None:
    first, second = tmp_path / "a" / "case.svs", tmp_path / "b" / "case.svs"
    for path, sample in ((first, good), (second, blurred)):
        path.parent.mkdir()
        shutil.copy(sample.path, path)
    out = tmp_path / "run"
    assert _tile(str(first), "--out", str(out)).exit_code == 0
    tiles = output_paths(out, "case")
    stamp = tiles.h5.stat().st_mtime_ns, tiles.qc.stat().st_mtime_ns

    result = _tile(str(second), "--out", str(out))  # default log level
    assert result.exit_code == 1
    assert str(first) in result.stderr and str(second) in result.stderr and "--overwrite" in result.stderr
    row = _rows(out)["case"]
    assert row["status"] == "failed" and str(first) in row["error"] and str(second) in row["error"]
    assert (tiles.h5.stat().st_mtime_ns, tiles.qc.stat().st_mtime_ns) == stamp  # nothing replaced
    assert read_tile_file(tiles.h5).slide_path == str(first)

    replaced = _tile(str(second), "--out", str(out), "--overwrite", "--min-blur-var", "0")
    assert replaced.exit_code == 0 and read_tile_file(tiles.h5).slide_path == str(second)


def test_a_moved_slide_is_retiled_not_refused(good, tmp_path: Path) -> None:
    old, new = tmp_path / "old" / "case.svs", tmp_path / "new" / "case.svs"
    old.parent.mkdir()
    shutil.copy(good.path, old)
    [r] = tile_slides([SlideSource("case", old)], out_dir=tmp_path / "run")
    assert r.status == "ok"
    new.parent.mkdir()
    old.rename(new)  # the old path is gone and the slide has the same size: it moved
    [r] = tile_slides([SlideSource("case", new)], out_dir=tmp_path / "run")
    assert r.status == "ok"
    assert read_tile_file(output_paths(tmp_path / "run", "case").h5).slide_path == str(new)


def test_unusable_or_repeated_ids_fail_alone(good, tmp_path: Path) -> None:
    sources = [
        SlideSource("../escape", good.path),  # would leave the output folder
        SlideSource("", good.path),
        SlideSource("fine", good.path),
        SlideSource("fine", tmp_path / "other.svs"),  # same id, another file: the later one is refused
    ]
    results = tile_slides(sources, out_dir=tmp_path / "run")
    assert [r.status for r in results] == ["failed", "failed", "ok", "failed"]
    assert "not a safe file name" in results[0].error and "unusable slide id" in results[1].error
    assert str(good.path) in results[3].error and "other.svs" in results[3].error
    assert not (tmp_path / "escape.h5").exists() and not (tmp_path / "run" / "escape.h5").exists()
    assert is_complete(output_paths(tmp_path / "run", "fine").h5)
    assert {r.status for r in read_manifest(tmp_path / "run" / "tiles" / "manifest.csv")} == {"ok", "failed"}


def test_a_file_name_without_letters_fails_that_slide_only(good, tmp_path: Path) -> None:
    folder = tmp_path / "slides"
    folder.mkdir()
    shutil.copy(good.path, folder / "good.svs")
    shutil.copy(good.path, folder / "!!!.svs")
    result = _tile(str(folder), "--out", str(tmp_path / "run"))
    assert result.exit_code == 1, result.output
    rows = _rows(tmp_path / "run")
    assert rows["good"]["status"] == "ok"
    assert [r["status"] for r in rows.values() if r["path"].endswith("!!!.svs")] == ["failed"]


def test_each_check_runs_once_per_slide(good, blurred, tmp_path: Path, monkeypatch) -> None:
    """The grid bound and the id check run once per slide: where the work starts (the batch, before the
    thumbnail is read), not again in every function the slide passes through."""
    import wsi.pipelines.tile.stage as stage
    import wsi.pipelines.tile.steps as steps
    import wsi.tiling.grid as grid

    calls: dict[str, list[object]] = {"grid": [], "id": []}

    def counting(name: str, fn):
        def wrapped(*args, **kwargs):
            calls[name].append(args[0])
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(steps, "check_grid", counting("grid", steps.check_grid))
    monkeypatch.setattr(grid, "check_grid", counting("grid", grid.check_grid))
    monkeypatch.setattr(stage, "check_usable_id", counting("id", stage.check_usable_id))
    sources = [SlideSource("good", good.path, None), SlideSource("all-blurred", blurred.path, None)]
    results = tile_slides(sources, out_dir=tmp_path / "run", progress=False)
    assert [r.status for r in results] == ["ok", "empty"]
    assert sorted(map(str, calls["grid"])) == sorted(str(s.path) for s in sources)
    assert calls["id"] == []  # the batch checked every id together (refuse_id_clashes), once

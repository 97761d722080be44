"""A filter that removes more than HEAVY_FILTER (5%) of a slide's tissue tiles is named, with its share,
in the manifest note and in `wsi tile`'s summary (also for a slide skipped as already tiled); under it,
neither says anything. On a generated slide (wsi.synthetic) with green marker ink painted over chosen
grid cells."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import tifffile
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.tile.findings import HEAVY_FILTER, heavy_filters
from wsi.pipelines.tile.stage import output_paths
from wsi.tiling.grid import TileCounts

MPP = 2.0  # 2048 um slide at 2 um/px: 1024 px, an 8 x 8 grid of 256 um tiles
TILE_ARGS = ["--tile-um", "256", "--tile-px", "64", "--backend", "tiffslide"]


@pytest.fixture(scope="module")
def inked(make_slide, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two copies of one generated slide as TIFFs: "many" with ink over 6 grid cells (> 5% of the
    tissue tiles), "few" over 1 (< 5%)."""
    tissue = [(100, 100, 1948, 1948)]
    base = make_slide(
        name="inkable", size_um=2048.0, mpp=MPP, seed=5, tissue_boxes_um=tissue, blur_boxes_um=()
    )
    rgb = tifffile.imread(base.path, key=0)
    folder = tmp_path_factory.mktemp("inked")
    side = round(256 / MPP)
    out = {}
    for name, cells in (("many", [(2, r) for r in range(1, 7)]), ("few", [(5, 3)])):
        img = rgb.copy()
        rng = np.random.default_rng(0)
        for col, row in cells:  # a green marker over whole cells, the tissue faintly showing through
            box = img[row * side : (row + 1) * side, col * side : (col + 1) * side].astype(np.float32)
            ink = np.array([30, 140, 70], np.float32) * (0.8 + 0.2 * box.mean(-1, keepdims=True) / 255)
            box = np.clip(ink + rng.normal(0, 4, box.shape), 0, 255)
            img[row * side : (row + 1) * side, col * side : (col + 1) * side] = box.astype(np.uint8)
        path = folder / f"{name}.tif"
        res = 1e4 / MPP  # pixels per centimetre
        tifffile.imwrite(
            path, img, tile=(256, 256), photometric="rgb", compression="jpeg", resolution=(res, res),
            resolutionunit="CENTIMETER",
        )  # fmt: skip
        out[name] = path
    return out


def _manifest(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "tiles" / "manifest.csv", newline="") as fh:
        return {row["slide"]: row for row in csv.DictReader(fh)}


def test_a_filter_over_the_threshold_is_named_with_its_share(inked: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["tile", str(inked["many"]), str(inked["few"]), "--out", str(out), *TILE_ARGS]
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    many = read_tile_file(output_paths(out, "many").h5).meta.counts
    few = read_tile_file(output_paths(out, "few").h5).meta.counts
    assert many.n_ink > HEAVY_FILTER * many.n_tissue  # the painted cells are rejected as ink
    assert 0 < few.n_ink <= HEAVY_FILTER * few.n_tissue
    share = f"ink removed {many.n_ink / many.n_tissue:.1%} ({many.n_ink} of {many.n_tissue})"
    rows = _manifest(out)
    note = rows["many"]["note"]
    assert f"check filter: {share} of the tissue tiles" in note
    assert "qc/many.png" in note and "--no-filter ink" in note
    assert f"many: check filter: {share}" in res.stderr  # the summary at the end of the run
    assert rows["few"]["note"] == f"rejected as artifacts: {few.n_ink} ink"  # counted, not flagged
    assert "few:" not in res.stderr and res.stderr.count("check filter") == 1

    again = CliRunner().invoke(cli, args, catch_exceptions=False)  # already tiled: skipped, still said
    assert again.exit_code == 0 and "2 already done" in again.stderr, again.stderr
    assert f"many: check filter: {share}" in again.stderr and "few:" not in again.stderr
    rows = _manifest(out)
    assert rows["many"]["status"] == "skipped" and rows["many"]["note"] == note


def test_the_threshold_and_each_filters_option() -> None:
    counts = TileCounts(n_grid=200, n_tissue=100, n_kept=80, n_blurry=6, n_ink=5, n_dust=9)
    found = heavy_filters(counts, {"ink": 5, "dust": 9, "artifact: pen": 6}, "s1", min_blur_variance=50.0,
                          max_artifact=0.25)  # fmt: skip
    assert found is not None and [f.name for f in found.filters] == ["blurry", "dust", "artifact: pen"]
    note = found.text()
    assert note.startswith("check filter: blurry removed 6.0% (6 of 100), dust removed 9.0% (9 of")
    assert "ink removed" not in note  # exactly 5% is not over it
    assert "--min-blur-var 50 (lower it" in note and "--no-filter dust" in note
    assert "artifact: pen removed 6.0%" in note and "--max-artifact 0.25 (raise it)" in note
    assert "qc/s1.png" in note and "qc/s1.geojson" in note and "--review" in note
    quiet = TileCounts(n_grid=200, n_tissue=100, n_kept=85, n_background=15, n_ink=5)
    assert heavy_filters(quiet, {"ink": 5}, "s1", min_blur_variance=50.0) is None  # background never counts
    assert heavy_filters(TileCounts(), {}, "s1", min_blur_variance=50.0) is None


def test_many_slides_with_one_heavy_filter_are_one_line() -> None:
    """The demo's 20 slides, each with a planted blurred patch, made 20 "check filter" lines in the walk's
    `wsi tile`; past a few slides the summary gives one line per filter, its slides, range and option."""
    from wsi.cli.tile import heavy_filter_lines

    def found(slide: str, k: int, n: int, **extra: int):
        return heavy_filters(TileCounts(n_tissue=n, n_blurry=k), extra, slide, min_blur_variance=50.0)

    few = [found("a", 3, 29), found("b", 2, 20)]
    assert heavy_filter_lines(few) == [f"{h.slide_id}: {h.text()}" for h in few]
    many = [found(f"DEMO-{i:02d}", 2 + i % 3, 29) for i in range(20)] + [found("inked", 1, 29, ink=9)]
    lines = heavy_filter_lines(many)
    assert len(lines) == 2, lines
    blur, ink = lines
    assert blur.startswith("check filter: blurry removed over 5% of the tissue tiles of 20 slides")
    assert "(6.9%-13.8% each: DEMO-00, DEMO-01, DEMO-02 and 17 more)" in blur
    assert blur.endswith("if it took tissue: --min-blur-var 50 (lower it; 0 turns the blur filter off)")
    assert ink.startswith("check filter: ink removed over 5% of the tissue tiles of 1 slide (31.0%: inked)")

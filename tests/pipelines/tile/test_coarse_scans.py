"""Scans coarser than the tiles and --mpp against metadata (issue 20, item 4)."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from wsi.cli.main import cli
from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.tile.findings import COARSE_FILTERS_MPP, coarse_filters_note, low_yield, upsampling_note
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.slide import open_slide
from wsi.slides.sources import SlideSource
from wsi.slides.thumbnail import read_thumbnail
from wsi.tiling import grid
from wsi.tiling.blur import blur_reduction
from wsi.tiling.grid import TileCounts, find_tissue
from wsi.tiling.params import ArtifactParams, TileParams


@pytest.fixture(scope="module")
def coarse(make_slide):
    """4 x 4 mm scanned at 4 um/px (1024 px): tiles of 256 um at 1 um/px are upsampled 4x."""
    return make_slide(name="coarse", size_um=4096.0, mpp=4.0, seed=3)


def _grid(slide, n: int = 16):
    cells = [(i * 256.0, j * 256.0) for j in range(n) for i in range(n)]
    sharp = [c for c in cells if slide.tissue_fraction(*c, 256) == 1 and slide.blur_fraction(*c, 256) == 0]
    blurred = [c for c in cells if slide.blur_fraction(*c, 256) >= 0.9]
    return sharp, blurred


def test_coarse_scan_judged_for_blur_at_its_own_resolution(coarse, tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="wsi.pipelines.tile"):
        [r] = tile_slides([SlideSource("coarse", coarse.path)], out_dir=tmp_path)
    assert r.status == "ok" and r.findings is not None and r.findings.low_yield is None
    assert r.note.startswith("check filter: blurry removed")  # its out-of-focus region: over 5%, named
    tf = read_tile_file(output_paths(tmp_path, "coarse").h5)
    assert tf.meta.upsampling == pytest.approx(4.0)
    assert "upsampled 4x" in caplog.text and "blur is judged at the scan's own resolution" in caplog.text
    kept = {tuple(c) for c in tf.coords_um.tolist()}
    sharp, blurred = _grid(coarse)
    assert len(sharp) > 50 and len(blurred) > 10
    assert set(sharp) <= kept  # every sharp tissue tile kept (upsampled, they all failed the blur test)
    assert not kept & set(blurred)  # the out-of-focus region still rejected


def test_blur_reduction_and_upsampling_factor() -> None:
    assert blur_reduction(0.25, 1.0, 256) == 1 and blur_reduction(1.0, 1.0, 256) == 1
    assert blur_reduction(4.0, 1.0, 256) == 4 and blur_reduction(2.0, 0.5, 224) == 4
    assert blur_reduction(40.0, 1.0, 64) == 4  # keeps 16 px a side for the blur test
    assert upsampling_note(0.5, 1.0) == (1.0, "") and upsampling_note(1.005, 1.0)[0] == 1.0
    factor, note = upsampling_note(4.0, 1.0)
    assert factor == 4.0 and "upsampled 4x" in note


def _low_yield(counts: TileCounts, artifacts: dict | None = None, max_artifact: float | None = None):
    params = TileParams()
    return low_yield(counts, min_blur_variance=params.min_blur_variance,
                     max_background=params.max_background_fraction, artifact_counts=artifacts,
                     max_artifact=max_artifact)  # fmt: skip


def test_low_yield_names_the_filter_and_its_option() -> None:
    few = _low_yield(TileCounts(n_grid=2000, n_tissue=1815, n_blurry=1800, n_background=12, n_kept=3))
    assert few is not None
    assert (few.kept, few.tissue, few.worst.name, few.worst.removed) == (3, 1815, "blurry", 1800)
    note = few.text()
    assert note.startswith("low yield: kept 3 of 1815 tissue tiles (0.2%, under 10%)")
    assert "most removed as blurry (1800)" in note and "--min-blur-var 50" in note
    art = _low_yield(TileCounts(n_grid=100, n_tissue=100, n_blurry=2, n_kept=5),
                     {"artifact: pen": 90, "artifact: fold": 3}, 0.25)  # fmt: skip
    assert art is not None and "most removed as artifact: pen (90)" in art.text()
    assert "--max-artifact 0.25" in art.worst.option
    ink = _low_yield(TileCounts(n_grid=100, n_tissue=100, n_blurry=2, n_kept=5, n_ink=93), {"ink": 93})
    assert ink is not None and ink.worst.name == "ink" and ink.worst.option == "--no-filter ink"
    assert _low_yield(TileCounts(n_tissue=100, n_kept=10, n_blurry=90)) is None  # 10%: fine
    assert _low_yield(TileCounts(n_tissue=100, n_kept=0, n_blurry=100)) is None  # empty: its own reason


def test_low_yield_slide_is_noted_in_manifest_and_summary(coarse, tmp_path: Path, monkeypatch) -> None:
    """The issue's case, reproduced by judging blur on the upsampled tiles (as before the fix)."""
    monkeypatch.setattr("wsi.pipelines.tile.filters.blur_reduction", lambda *args: 1)
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["tile", str(coarse.path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    with open(out / "tiles" / "manifest.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["status"] == "ok" and rows[0]["note"].startswith("low yield: kept ")
    assert "most removed as blurry" in rows[0]["note"] and "upsampled 4x" in rows[0]["note"]
    assert "coarse: low yield: kept" in result.stderr and "--min-blur-var" in result.stderr


def test_mpp_against_metadata_says_which_wins_and_override_forces_it(
    sample_slide, tmp_path: Path, caplog
) -> None:
    src = [SlideSource("s", sample_slide.path)]
    with caplog.at_level(logging.INFO, logger="wsi.pipelines.tile"):
        [r] = tile_slides(src, out_dir=tmp_path, mpp=0.4)
    assert r.status == "ok"
    assert "the metadata's 0.5 um/px wins over --mpp 0.4" in caplog.text and "--mpp-override" in caplog.text
    tf = read_tile_file(output_paths(tmp_path, "s").h5)
    assert tf.mpp == pytest.approx(0.5) and tf.meta.mpp_source == "metadata"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="wsi.pipelines.tile"):
        [forced] = tile_slides(src, out_dir=tmp_path, mpp=0.4, mpp_override=True)
    assert forced.status == "ok"  # recomputed, not skipped: the override changes the mpp
    assert "--mpp 0.4 wins over the metadata's 0.5 um/px (--mpp-override)" in caplog.text
    tf = read_tile_file(output_paths(tmp_path, "s").h5)
    assert tf.mpp == pytest.approx(0.4) and tf.meta.mpp_source == "--mpp-override"
    [again] = tile_slides(src, out_dir=tmp_path, mpp=0.4, mpp_override=True)
    assert again.status == "skipped"
    bad = CliRunner().invoke(cli, ["tile", str(sample_slide.path), "--out", str(tmp_path), "--mpp-override"])
    assert bad.exit_code == 2 and "--mpp-override needs --mpp" in bad.stderr


def test_filters_on_a_thumbnail_coarser_than_they_were_chosen_at_are_noted() -> None:
    params = ArtifactParams()
    assert coarse_filters_note(16.0, params, ran=True) == ""  # a slide: its thumbnail judged at 16 um/px
    assert coarse_filters_note(COARSE_FILTERS_MPP, params, ran=True) == ""
    note = coarse_filters_note(40.0, params, ran=True)
    assert "only at 40 um/px" in note and "red marker over tissue is told from blood less well" in note
    assert coarse_filters_note(40.0, params, ran=False) == ""  # the filters did not run (dark background)
    assert coarse_filters_note(40.0, ArtifactParams(ink_colours=("black", "green")), ran=True) == ""
    assert coarse_filters_note(40.0, ArtifactParams(filters=("fold",)), ran=True) == ""


def test_a_plain_image_at_40_um_per_px_warns_that_red_marker_may_be_kept(
    shared_data: Path, tmp_path: Path, caplog
) -> None:
    """HistoQC's red pen thumbnail as a 40 um/px image (its own pixels: 16 um/px scaled down 2.5x): tiled,
    with the note; the same image at --mpp 16 has none."""
    src = Image.open(shared_data / "artifacts" / "histoqc" / "pen__1k_version__pen_red.png").convert("RGB")
    small = tmp_path / "pen_red_40.png"
    src.resize((round(src.width / 2.5), round(src.height / 2.5)), Image.LANCZOS).save(small)
    with caplog.at_level(logging.WARNING, logger="wsi.pipelines.tile"):
        [r] = tile_slides([SlideSource("red40", small, mpp=40.0)], out_dir=tmp_path / "a")
    assert r.status == "ok" and "could judge this slide only at 40 um/px" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="wsi.pipelines.tile"):
        [r] = tile_slides([SlideSource("red16", small, mpp=16.0)], out_dir=tmp_path / "b")
    assert r.status == "ok" and "could judge this slide only" not in caplog.text


def test_filters_judge_a_coarse_image_at_its_own_pixels_not_the_enlarged_thumbnail(
    shared_data: Path, tmp_path: Path, monkeypatch
) -> None:
    """A 16 um/px image is enlarged to the 8 um/px tissue thumbnail; the artifact filters still see its
    own pixels (what they were chosen and are measured on: the enlargement alone moved HistoQC's red pen
    from 1.8% to 6.8% of its red-inked tiles kept), and their regions land on the right tiles."""
    png = shared_data / "artifacts" / "histoqc" / "pen__1k_version__pen_red.png"
    own = np.asarray(Image.open(png).convert("RGB"))
    seen: list[tuple[tuple[int, ...], float, bool]] = []
    real = grid.find_artifacts

    def spy(image, tissue, *, mpp, params):
        seen.append((image.shape, mpp, bool(np.array_equal(image, own))))
        return real(image, tissue, mpp=mpp, params=params)

    monkeypatch.setattr(grid, "find_artifacts", spy)
    [r] = tile_slides([SlideSource("red16", png, mpp=16.0)], out_dir=tmp_path)
    assert r.status == "ok" and seen == [(own.shape, pytest.approx(16.0), True)]
    assert r.findings is not None and r.findings.ink_colours.get("red", 0) >= 150  # HistoQC's red: 190 tiles


def test_find_tissue_reads_a_coarse_slides_own_pixels_itself(shared_data: Path) -> None:
    """`find_tissue(slide, params)` with no thumbnail (the library's own use) judges the same own pixels as
    the tile stage: the verdicts equal those given the image itself."""
    png = shared_data / "artifacts" / "histoqc" / "pen__1k_version__pen_red.png"
    own = np.asarray(Image.open(png).convert("RGB"))
    with open_slide(png, mpp=16.0) as slide:
        alone = find_tissue(slide, TileParams())
        given = find_tissue(slide, TileParams(), thumbnail=read_thumbnail(slide, 8.0), own_pixels=own)
    assert alone.region_codes is not None and (alone.region_codes == 4).sum() >= 150
    np.testing.assert_array_equal(alone.region_codes, given.region_codes)

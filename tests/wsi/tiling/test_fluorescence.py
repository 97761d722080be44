"""Dark-background (fluorescence-like) slides (issue 10, item 6): detected from pixels and metadata, tiled
with filters that fit them, and never a silent all-blurry result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.slide import open_slide
from wsi.slides.sources import SlideSource
from wsi.slides.thumbnail import read_thumbnail
from wsi.tiling.background import detect_background, fluorescence_hints, with_signal_gain
from wsi.tiling.grid import find_tissue
from wsi.tiling.params import TileParams


@pytest.fixture(scope="module")
def fluo(make_slide):
    """2 x 2 mm at 0.5 um/px, two tissue boxes and one blurred box (the default scene), dark background,
    sparse bright DAPI-like nuclei on dim FITC-like tissue; pyramidal, channels named in the metadata."""
    return make_slide(name="fluo", size_um=2048.0, mpp=0.5, seed=2, stain="fluorescence")


@pytest.fixture(scope="module")
def fluo_tiled(fluo, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("fluo-run")
    [result] = tile_slides([SlideSource("fluo", fluo.path)], out_dir=out)
    return result, read_tile_file(output_paths(out, "fluo").h5)


def test_generated_fluorescence_slide_is_dark_pyramidal_with_channel_names(fluo) -> None:
    assert fluo.stain == "fluorescence" and fluo.n_levels >= 4
    with open_slide(fluo.path) as slide:
        assert slide.properties.get("aperio.Channels") == "DAPI,FITC"
        thumb = read_thumbnail(slide, 8.0).image
        tx0, ty0, _, _ = fluo.tissue_boxes_um[1]
        tile = slide.read_region_um(round((tx0 + 20) / 0.5), round((ty0 + 20) / 0.5), 200, 0.5)
    assert thumb[:4, :4].max() < 20  # the corner is dark, not glass
    blue, green = tile[..., 2].astype(int), tile[..., 1].astype(int)
    assert np.percentile(blue, 99.5) > 150  # bright nuclei ...
    assert (blue > 120).mean() < 0.2  # ... and sparse
    assert 25 < np.median(green) < 90  # dim tissue signal


def test_detected_from_pixels_and_from_metadata(fluo, sample_slide) -> None:
    with open_slide(fluo.path) as slide:
        thumb = read_thumbnail(slide, 8.0).image
        props = slide.properties
    dark = detect_background(thumb, {})  # pixels alone
    assert dark.dark and "fluorescence" in dark.reason
    assert "DAPI" in detect_background(thumb, props).reason  # metadata named in the reason
    with open_slide(sample_slide.path) as slide:
        light = read_thumbnail(slide, 8.0).image
        assert not detect_background(light, slide.properties).dark  # H&E stays light
    assert detect_background(thumb, {}, choice="light").kind == "light"  # --background forces it
    ome = '<Channel ID="Channel:0:0" Name="DAPI" Fluor="DAPI" IlluminationType="Epifluorescence"/>'
    assert fluorescence_hints({"tiff.ImageDescription": ome}) == ["DAPI", "Epifluorescence"]
    # a dim-but-dark thumbnail counts as dark only with the metadata's word for it
    grey = np.full((64, 64, 3), 90, np.uint8)
    assert not detect_background(grey, {}).dark and detect_background(grey, {"x": "FITC"}).dark


def test_tissue_found_and_sharp_tiles_kept_blurred_ones_rejected(fluo, fluo_tiled) -> None:
    result, tf = fluo_tiled
    assert result.status == "ok", result.error
    m = tf.meta
    c = m.counts
    assert m.background.kind == "dark" and m.background.choice == "auto"
    # the noise-level mask (issue 20) reaches a cell or two at the tissue's dim edge, which the tile filter
    # then rejects as mostly dark: correct, and never more than a couple
    assert c.n_tissue >= 40 and c.n_background <= 2
    kept = {tuple(xy) for xy in tf.coords_um.tolist()}
    grid = [(i * 256.0, j * 256.0) for j in range(8) for i in range(8)]
    sharp = [c for c in grid if fluo.tissue_fraction(*c, 256) == 1 and fluo.blur_fraction(*c, 256) == 0]
    blurred = [c for c in grid if fluo.blur_fraction(*c, 256) >= 0.9]
    assert sharp and blurred
    assert set(sharp) <= kept  # every sharp tissue tile kept (the H&E filters kept none of them)
    assert not kept & set(blurred)  # and the out-of-focus ones rejected as blurry
    assert c.n_blurry >= len(blurred)
    for x, y in kept:
        assert fluo.tissue_fraction(x, y, 256) >= 0.2  # never on the dark background


def test_forced_light_on_a_dark_slide_is_loud_not_silent(fluo, tmp_path: Path) -> None:
    """The H&E filters on a fluorescence slide keep nothing: that is status empty with the reason."""
    [r] = tile_slides([SlideSource("fluo", fluo.path)], out_dir=tmp_path, background="light")
    assert r.status == "empty" and r.n == 0
    assert "blurry" in r.error and "--min-blur-var" in r.error and "--background dark" in r.error
    # and a run with other --background is recomputed, not skipped
    [again] = tile_slides([SlideSource("fluo", fluo.path)], out_dir=tmp_path)
    assert again.status == "ok" and again.n > 0


def test_a_dim_dark_slide_is_brightened_for_the_blur_test_by_at_most_4x(fluo) -> None:
    with open_slide(fluo.path) as slide:
        found = find_tissue(slide, TileParams())
    assert found.background.dark and found.background.gain == 1.0  # well exposed: left alone
    dim = (found.thumb // 3).astype(np.uint8)
    gained = with_signal_gain(found.background, dim, found.mask)
    assert 2.0 < gained.gain <= 4.0 and "brightened" in gained.reason
    black = np.zeros_like(found.thumb)
    assert with_signal_gain(found.background, black, found.mask).gain == 4.0

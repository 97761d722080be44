"""A dim fluorescence scan (issue 20, item 6): tissue found from the dark background's own noise level.

The slide is a TRITC-like single channel: a noisy black background (level 6, noise sd 2.5 per pixel) and
tissue only 8-16 grey levels above it, under the old fixed floor of 25 everywhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile

from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.slide import open_slide
from wsi.slides.sources import SlideSource
from wsi.tiling.dark_noise import dark_noise
from wsi.tiling.grid import find_tissue
from wsi.tiling.params import TileParams

SIZE = 3072  # px at 1 um/px: 3 x 3 mm


def _truth() -> np.ndarray:
    """(SIZE, SIZE) bool: a disc of 700 um radius and a 600 x 1400 um strip."""
    yy, xx = np.mgrid[:SIZE, :SIZE]
    disc = (xx - 1000) ** 2 + (yy - 1100) ** 2 < 700**2
    strip = (xx >= 2100) & (xx < 2700) & (yy >= 800) & (yy < 2200)
    return disc | strip


def _write(path: Path, *, tissue: bool, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    red = 6.0 + rng.normal(0.0, 2.5, (SIZE, SIZE))
    if tissue:
        # cell-sized texture, 8-16 levels above the background: faint but sharp
        blobs = rng.random((SIZE // 6, SIZE // 6)).repeat(6, 0).repeat(6, 1)
        red += _truth() * (8.0 + 8.0 * blobs)
    rgb = np.zeros((SIZE, SIZE, 3), np.uint8)
    rgb[..., 0] = np.clip(np.rint(red), 0, 255).astype(np.uint8)
    rgb[..., 2] = np.clip(np.rint(rgb[..., 0] * 0.3), 0, 255).astype(np.uint8)  # a little bleed-through
    tifffile.imwrite(
        path,
        rgb,
        tile=(256, 256),
        photometric="rgb",
        resolution=(10_000, 10_000),
        resolutionunit="CENTIMETER",
    )


@pytest.fixture(scope="module")
def dim_slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dim") / "tritc.tif"
    _write(path, tissue=True)
    return path


def test_noise_model_of_a_noisy_black_background() -> None:
    rng = np.random.default_rng(1)
    high = np.clip(np.rint(20 + rng.normal(0, 3.0, 200_000)), 0, 255).astype(np.uint8)
    noise = dark_noise(np.concatenate([high, np.full(50_000, 90, np.uint8)]), k=4.0)  # + bright tissue
    assert noise.background == pytest.approx(20, abs=1)
    assert noise.sigma == pytest.approx(3.0, rel=0.15)
    assert noise.threshold == pytest.approx(32, abs=2)
    flat = dark_noise(np.full(1000, 6, np.uint8), k=4.0)  # no noise at all: one grey level assumed
    assert (flat.background, flat.sigma, flat.threshold) == (6.0, 1.0, 10.0)


def test_dim_tissue_found_from_the_background_noise(dim_slide: Path) -> None:
    with open_slide(dim_slide) as slide:
        found = find_tissue(slide, TileParams())
        thumb_mpp = found.thumb.shape[1] and SIZE / found.thumb.shape[1]
    assert found.background.dark, found.background.reason
    truth = _truth()[:: round(thumb_mpp), :: round(thumb_mpp)][: found.mask.shape[0], : found.mask.shape[1]]
    high = found.thumb.max(axis=-1)
    assert np.percentile(high[truth], 90) < 25  # the old fixed floor (25) would have found nothing
    recall = (found.mask & truth).sum() / truth.sum()
    false = (found.mask & ~truth).sum() / (~truth).sum()
    assert recall > 0.95 and false < 0.02, (recall, false)
    assert found.background.signal_level is not None and found.background.signal_level < 25
    assert "signal above" in found.background.reason


def test_dim_slide_keeps_its_tissue_tiles_and_a_blank_one_none(dim_slide: Path, tmp_path: Path) -> None:
    blank = tmp_path / "blank.tif"
    _write(blank, tissue=False, seed=3)
    results = tile_slides([SlideSource("tritc", dim_slide), SlideSource("blank", blank)], out_dir=tmp_path)
    assert results[0].status == "ok", results[0].error
    tf = read_tile_file(output_paths(tmp_path, "tritc").h5)
    truth = _truth()
    inside = [truth[int(y) : int(y) + 256, int(x) : int(x) + 256].mean() for x, y in tf.coords.tolist()]
    full = sum(
        truth[y : y + 256, x : x + 256].all()
        for y in range(0, SIZE - 255, 256)
        for x in range(0, SIZE - 255, 256)
    )
    assert min(inside) >= 0.2  # never a tile of noise alone
    assert tf.meta.counts.n_kept >= full  # every tile wholly inside the tissue (and edge tiles) kept
    assert results[1].status == "empty" and "noise" in (results[1].error or "")

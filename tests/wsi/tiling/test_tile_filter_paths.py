"""The per-tile filters' faster paths give the verdicts of the paths they replace (issue 35).

- Background and blur: the shortcut (`wsi.tiling.filter_bounds.surely_kept`) gives the exact filters' verdicts
  (`wsi.tiling.grid.classify_exact`) on real H&E tiles, blurred around the threshold, paled toward glass, at
  the tissue's edge, and on tiles built to fool a row sample; and it does pass most sharp tissue tiles.
- Ink: the tile's ink share (optical density of the red candidates only, a cheaper hue) equals the one
  computed before, on real marker, lookalike and slide tiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage

from wsi.pipelines.tile.read import read_tile_chunks
from wsi.slides.slide import open_slide
from wsi.tiling.artifacts import ArtifactParams, hsv, tile_ink_share
from wsi.tiling.artifacts.colour import TILE_STRIDE, ink_rules, ink_sample, is_red_ink, optical_density
from wsi.tiling.blur import blur_variance
from wsi.tiling.filter_bounds import STRIDE, surely_kept
from wsi.tiling.grid import BACKGROUND, BLURRY, KEPT, classify_exact, classify_tiles, find_tissue
from wsi.tiling.params import TileParams


def _tiles(path: Path, params: TileParams, mpp: float | None = None) -> np.ndarray:
    with open_slide(path, mpp=mpp) as slide:
        coords = find_tissue(slide, params).candidate_coords
        return np.concatenate(list(read_tile_chunks(slide, coords, params, 1)))


def _blurred(tiles: np.ndarray, sigma: float) -> np.ndarray:
    return np.stack([ndimage.gaussian_filter(t, sigma=(sigma, sigma, 0)) for t in tiles])


def _paled(tiles: np.ndarray, alpha: float) -> np.ndarray:
    """Mixed toward white: more of each tile's pixels near-white (background at the 0.8 mark)."""
    return np.rint(tiles * (1 - alpha) + 255 * alpha).astype(np.uint8)


def _same(tiles: np.ndarray, params: TileParams) -> np.ndarray:
    """Both paths in the stage's chunks of 16; the verdicts, asserted equal."""
    fast = np.concatenate([classify_tiles(tiles[i : i + 16], params) for i in range(0, len(tiles), 16)])
    exact = np.concatenate([classify_exact(tiles[i : i + 16], params) for i in range(0, len(tiles), 16)])
    assert fast.tolist() == exact.tolist()
    return exact


def _sure(tiles: np.ndarray, params: TileParams) -> np.ndarray:
    return surely_kept(
        tiles, white_level=params.white_level, max_background_fraction=params.max_background_fraction,
        min_blur_variance=params.min_blur_variance,
    )  # fmt: skip


@pytest.fixture(scope="module")
def real_tiles(shared_data: Path) -> np.ndarray:
    """Tissue tiles of both real slides, 256 px, at their own scan resolution and coarser."""
    slides = shared_data / "slides"
    parts = [
        _tiles(slides / "CMU-1-Small-Region.svs", TileParams()),  # 0.499 um/px scan, 1 um/px tiles
        _tiles(slides / "CMU-1-Small-Region.svs", TileParams(tile_um=128.0)),  # 0.5 um/px
        # the TCGA crop carries no resolution: taken as 0.5 um/px, its tiles at 1 and 0.5 um/px
        _tiles(slides / "tcga-cr-7395-01a-01-ts1.svs", TileParams(), mpp=0.5),
        _tiles(slides / "tcga-cr-7395-01a-01-ts1.svs", TileParams(tile_um=128.0), mpp=0.5),
    ]
    return np.concatenate(parts)


def test_shortcut_verdicts_equal_exact_on_real_tiles(real_tiles: np.ndarray) -> None:
    params = TileParams()
    reasons = _same(real_tiles, params)
    assert len(real_tiles) >= 100 and np.count_nonzero(reasons == KEPT) >= 60
    sure = np.concatenate([_sure(real_tiles[i : i + 16], params) for i in range(0, len(real_tiles), 16)])
    # not a shortcut in name only: most sharp tissue tiles pass without the full computation
    assert np.count_nonzero(sure) >= 0.6 * np.count_nonzero(reasons == KEPT)
    assert not sure[reasons != KEPT].any()


@pytest.mark.parametrize("sigma", [0.6, 0.8, 1.0, 1.3, 1.7, 2.3])
def test_shortcut_verdicts_equal_exact_on_blurred_real_tiles(real_tiles: np.ndarray, sigma: float) -> None:
    """Blurred by a Gaussian, the real tiles' scores fall through the threshold (a 1 um blur scores
    100-600, a 2 um one 20-50): every verdict on either side of it is the exact one's."""
    params = TileParams()
    tiles = _blurred(real_tiles, sigma)
    reasons = _same(tiles, params)
    scores = blur_variance(tiles, white_level=params.white_level)
    near = (scores > 0.5 * params.min_blur_variance) & (scores < 4 * params.min_blur_variance)
    if 1.0 <= sigma <= 1.7:  # the threshold is crossed here: tiles just above and below it were judged
        assert np.count_nonzero(near) >= 10
    if sigma >= 1.7:
        assert np.count_nonzero(reasons == BLURRY) >= 10


@pytest.mark.parametrize("threshold", [5.0, 20.0, 150.0, 500.0, 1500.0, 4000.0])
def test_shortcut_verdicts_equal_exact_at_other_thresholds(real_tiles: np.ndarray, threshold: float) -> None:
    """Other --min-blur-variance settings: the bound holds at any threshold, not only the default's."""
    params = TileParams(min_blur_variance=threshold)
    _same(real_tiles, params)
    _same(_blurred(real_tiles[::3], 1.0), params)


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.6, 0.7])
def test_shortcut_verdicts_equal_exact_on_pale_tiles(real_tiles: np.ndarray, alpha: float) -> None:
    """Paled toward glass: fewer tissue pixels, blocks around a quarter tissue."""
    _same(_paled(real_tiles, alpha), TileParams())


@pytest.mark.parametrize("columns", [150, 190, 198, 204, 206, 214])
def test_shortcut_verdicts_equal_exact_at_the_tissue_edge(real_tiles: np.ndarray, columns: int) -> None:
    """Glass over the first `columns` of each tile (the tissue's edge): background fractions through
    the 0.8 mark (204.8 of 256 columns), blocks through a quarter tissue."""
    tiles = real_tiles.copy()
    tiles[:, :, :columns] = 242
    reasons = _same(tiles, TileParams())
    if columns >= 206:
        assert np.count_nonzero(reasons == BACKGROUND) >= 0.5 * len(tiles)
    if columns <= 190:
        assert np.count_nonzero(reasons == BACKGROUND) < 0.5 * len(tiles)


def test_shortcut_not_fooled_by_what_the_sample_leaves_out(real_tiles: np.ndarray) -> None:
    """Tiles that differ from what the row sample sees: sharp only in unsampled rows, glass in the
    unsampled rows, blurred in them: each verdict is the exact one's."""
    params = TileParams()
    sharp = real_tiles[:24]
    p = sharp.shape[1]
    sampled = np.zeros(p, bool)
    for centre in range(0, p - 2, STRIDE):
        sampled[centre : centre + 3] = True
    flat = np.full_like(sharp, 200)
    only_unsampled = np.where(sampled[None, :, None, None], flat, sharp)  # sharp where it is not seen
    glass = np.where(sampled[None, :, None, None], sharp, np.uint8(255))  # glass where it is not seen
    blurred = np.where(sampled[None, :, None, None], sharp, _blurred(sharp, 3.0))
    for tiles in (only_unsampled, glass, blurred):
        _same(tiles, params)
    # the tile sharp where unsampled is not passed by the bound, whatever its exact verdict
    assert not _sure(only_unsampled, params).any()


def test_shortcut_verdicts_equal_exact_on_a_generated_slide(sample_slide: Callable) -> None:
    """The generated sample slide (tissue boxes, one blurred box): same verdicts, blurred tiles found."""
    params = TileParams(tile_um=128.0, tile_px=256)
    tiles = _tiles(Path(sample_slide.path), params)
    reasons = _same(tiles, params)
    assert np.count_nonzero(reasons == BLURRY) >= 2 and np.count_nonzero(reasons == KEPT) >= 10


def test_small_tiles_and_other_modes_take_the_exact_path(real_tiles: np.ndarray) -> None:
    """Tiles under 64 px, dark mode and coarse scans go through the exact filters only."""
    params = TileParams()
    assert not _sure(real_tiles[:4, :48, :48], params).any()
    small = dataclasses.replace(params, tile_px=48)
    _same(np.ascontiguousarray(real_tiles[:8, :48, :48]), small)
    dark = 255 - real_tiles[:8]
    fast, exact = classify_tiles(dark, params, dark=True), classify_exact(dark, params, dark=True)
    assert fast.tolist() == exact.tolist()


# ------------------------------------------------------------------------------ the tile's own ink share
def _reference_hsv(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`wsi.tiling.artifacts.colour.hsv` as it was before issue 35 (the hue's `% 360`)."""
    px = rgb[..., :3].astype(np.float32)
    r, g, b = px[..., 0], px[..., 1], px[..., 2]
    high = np.maximum(np.maximum(r, g), b)
    low = np.minimum(np.minimum(r, g), b)
    span = high - low
    safe = np.where(span > 0, span, 1.0)
    hue = np.where(high == r, (g - b) / safe, np.where(high == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe))
    hue = (hue * 60.0) % 360.0
    hue = np.where(span > 0, hue, 0.0)
    sat = np.where(high > 0, span / np.maximum(high, 1.0), 0.0)
    return hue.astype(np.float32), sat.astype(np.float32), (high / 255.0).astype(np.float32)


def _reference_ink_share(tiles: np.ndarray, params: ArtifactParams) -> np.ndarray:
    """The tile ink share as it was computed before issue 35: the optical density of every pixel of a
    tile with red candidates, and np.nanmedian."""
    sample = tiles[:, ::TILE_STRIDE, ::TILE_STRIDE].reshape(len(tiles), -1, 3)
    colours = ink_rules(_reference_hsv(sample), params)
    ink = colours["green"] | colours["blue"] | colours["black"]
    red = colours["red"]
    rows = np.flatnonzero(red.any(axis=1))
    if len(rows):
        ink[rows] |= red[rows] & is_red_ink(optical_density(sample[rows]), red[rows], params)[:, None]
    return np.count_nonzero(ink, axis=1) / ink.shape[1]


def _image_tiles(path: Path, px: int = 256) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB"))
    h, w = rgb.shape[:2]
    tiles = [rgb[y : y + px, x : x + px] for y in range(0, h - px + 1, px) for x in range(0, w - px + 1, px)]
    return np.stack(tiles) if tiles else np.zeros((0, px, px, 3), np.uint8)


@pytest.fixture(scope="module")
def ink_tiles(shared_data: Path, real_tiles: np.ndarray) -> np.ndarray:
    """256 px tiles of every marker, lookalike and pen image of ../shared/data/artifacts (red, green,
    blue and black marker, blood, red muscle, eosin-rich stroma) and the real slides' tissue tiles."""
    images = sorted(p for p in (shared_data / "artifacts").rglob("*") if p.suffix in (".png", ".jpg"))
    parts = [_image_tiles(p) for p in images if not p.stem.endswith("_mask")]
    return np.concatenate([*parts, real_tiles])


def test_ink_share_equals_the_reference_on_real_marker_and_lookalikes(ink_tiles: np.ndarray) -> None:
    params = ArtifactParams()
    chunks = [ink_tiles[i : i + 16] for i in range(0, len(ink_tiles), 16)]  # as the stage's chunks
    new = np.concatenate([tile_ink_share(chunk, params) for chunk in chunks])
    old = np.concatenate([_reference_ink_share(chunk, params) for chunk in chunks])
    assert new.tolist() == old.tolist()
    # not vacuous: inked tiles, tiles with red candidates judged by their density, and clean ones
    assert np.count_nonzero(new > params.max_ink_fraction) >= 20
    assert np.count_nonzero((new > 0) & (new <= params.max_ink_fraction)) >= 20
    red = ink_rules(hsv(ink_sample(ink_tiles)), params)["red"]
    assert np.count_nonzero(red.any(axis=1)) >= 50


def test_hsv_equals_the_reference_on_every_colour() -> None:
    """Every 8-bit colour (hue, saturation and value compared by value: the hue of a grey is 0)."""
    axis = np.arange(256, dtype=np.uint8)
    for reds in np.array_split(axis, 16):  # 1 M colours at a time: modest memory
        rgb = np.stack(np.meshgrid(reds, axis, axis, indexing="ij"), axis=-1).reshape(-1, 3)
        for new, old in zip(hsv(rgb), _reference_hsv(rgb), strict=True):
            assert np.array_equal(new, old)


def test_sampled_laplacian_is_the_grayscale_one_within_rounding(real_tiles: np.ndarray) -> None:
    """The shortcut's Laplacian (per channel in integers, then weighted) is the exact filter's (of the
    float32 grayscale) to within 0.01 a pixel on real H&E, so MARGIN (1% of the threshold) covers it."""
    from wsi.tiling.blur import GRAY

    tiles = real_tiles[:32].astype(np.float32)
    def laplacian(x: np.ndarray) -> np.ndarray:
        return 4 * x[:, 1:-1, 1:-1] - x[:, :-2, 1:-1] - x[:, 2:, 1:-1] - x[:, 1:-1, :-2] - x[:, 1:-1, 2:]

    exact = laplacian(tiles @ GRAY)
    weighted = laplacian(real_tiles[:32].astype(np.int16)).astype(np.float32) @ GRAY
    assert np.abs(weighted - exact).max() < 0.01
    assert np.abs(exact).max() > 50  # real texture, not a flat tile

"""Grid in micrometres and the background / blur filters on tile pixels."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import ndimage

from wsi.core.config import parse_config
from wsi.core.errors import ConfigError
from wsi.tiling.blur import background_fraction, blur_variance
from wsi.tiling.grid import (
    BACKGROUND,
    BLURRY,
    KEPT,
    TileParams,
    classify_tiles,
    make_grid,
    tissue_fractions,
)
from wsi.tiling.params import TissueParams


def test_grid_is_physical_across_resolutions() -> None:
    """One 2,000 x 1,000 um scene at 0.25 and 0.5 um/px: identical cells in um, pixels scale by 2."""
    fine = make_grid(8000, 4000, mpp=0.25, tile_um=256)
    coarse = make_grid(4000, 2000, mpp=0.5, tile_um=256)
    assert (fine.n_cols, fine.n_rows) == (coarse.n_cols, coarse.n_rows) == (7, 3)
    np.testing.assert_array_equal(fine.coords_um, coarse.coords_um)
    np.testing.assert_array_equal(fine.coords, coarse.coords * 2)
    np.testing.assert_allclose(fine.coords * 0.25, fine.coords_um, atol=0.125)
    assert fine.coords.dtype == np.int64 and fine.coords_um.dtype == np.float32


def test_grid_only_whole_cells_and_non_integer_step() -> None:
    grid = make_grid(1000, 999, mpp=0.499, tile_um=256)  # step 513.03 px
    assert (grid.n_cols, grid.n_rows) == (1, 1)
    grid = make_grid(2220, 2967, mpp=0.499, tile_um=256)
    assert (grid.n_cols, grid.n_rows) == (4, 5)
    assert grid.coords[:, 0].max() + grid.step_px <= 2220 + 0.5
    np.testing.assert_array_equal(np.unique(grid.coords[:, 0]), [0, 513, 1026, 1539])


def test_tissue_fractions_follow_mask() -> None:
    grid = make_grid(4096, 4096, mpp=0.25, tile_um=256)  # 4 x 4 cells of 1024 px
    mask = np.zeros((128, 128), bool)  # 32 px per cell
    mask[:32, :32] = True  # cell (0, 0) full
    mask[32:48, 32:64] = True  # cell (1, 1) half
    frac = tissue_fractions(grid, mask, level0_width=4096, level0_height=4096).reshape(4, 4)
    assert frac[0, 0] == pytest.approx(1.0)
    assert frac[1, 1] == pytest.approx(0.5)
    assert frac.sum() == pytest.approx(1.5)


def _texture(seed: int = 0, p: int = 64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = np.array([200, 120, 170], np.float32)
    noise = rng.normal(0, 30, (p, p, 1)).astype(np.float32)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def test_filters_background_blurry_kept() -> None:
    sharp = _texture()
    blurred = np.clip(ndimage.gaussian_filter(sharp.astype(float), (3, 3, 0)), 0, 255).astype(np.uint8)
    glass = np.full_like(sharp, 243)
    mostly_glass = glass.copy()
    mostly_glass[:, :8] = sharp[:, :8]  # 1/8 tissue
    half_glass = glass.copy()
    half_glass[:, :32] = sharp[:, :32]  # a sharp fragment on glass is not blurry
    tiles = np.stack([sharp, blurred, glass, mostly_glass, half_glass])
    np.testing.assert_allclose(background_fraction(tiles, white_level=220), [0, 0, 1, 7 / 8, 0.5])
    reasons = classify_tiles(tiles, TileParams(tile_px=64, tile_um=64))
    assert reasons.tolist() == [KEPT, BLURRY, BACKGROUND, BACKGROUND, KEPT]
    scores = blur_variance(tiles, white_level=220)
    assert scores[0] > 100 * scores[1]


def test_mostly_blurred_tile_is_blurry() -> None:
    """A sharp strip does not rescue a tile whose tissue is mostly out of focus."""
    sharp = _texture(1, 128)
    blurred = np.clip(ndimage.gaussian_filter(sharp.astype(float), (3, 3, 0)), 0, 255).astype(np.uint8)
    mix = blurred.copy()
    mix[:, :24] = sharp[:, :24]  # 19% sharp
    assert classify_tiles(mix[None], TileParams(tile_px=128, tile_um=128)).tolist() == [BLURRY]


def test_params_json_round_trip_and_validation() -> None:
    params = TileParams(tile_um=224, tile_px=224, tissue=TissueParams(thumb_mpp=4))
    assert params.target_mpp == 1.0
    stored = json.loads(json.dumps(params.to_dict(), sort_keys=True))  # as a tile file keeps it
    assert parse_config(TileParams, stored, source="t.h5") == params
    with pytest.raises(ValueError, match="min_tissue_fraction"):
        TileParams(min_tissue_fraction=1.5)
    with pytest.raises(ValueError, match="tile_um"):
        TileParams(tile_um=0)


def test_params_from_a_mapping_go_through_the_one_validator() -> None:
    """Unknown keys (top level and nested) are refused by name; range rules and types are checked."""
    with pytest.raises(ConfigError, match=r"^run\.json: ") as err:
        parse_config(TileParams, {"tile_size": 256, "tissue": {"otsu": True}}, source="run.json")
    assert "unknown field 'tile_size'" in str(err.value) and "unknown field 'tissue.otsu'" in str(err.value)
    with pytest.raises(ConfigError, match=r"'min_tissue_fraction'.*less than or equal to 1 \(got 1\.5\)"):
        parse_config(TileParams, {"min_tissue_fraction": 1.5}, source="run.json")
    with pytest.raises(ConfigError, match=r"'tissue\.thumb_mpp'.*greater than or equal to 0\.5 \(got 0\)"):
        parse_config(TileParams, {"tissue": {"thumb_mpp": 0}}, source="run.json")
    # direct construction meets the same ranges (wsi.core.config.check_bounds)
    with pytest.raises(ValueError, match=r"TileParams\.min_tissue_fraction must be <= 1, got 1\.5"):
        TileParams(min_tissue_fraction=1.5)
    with pytest.raises(ValueError, match=r"TissueParams\.thumb_mpp must be >= 0\.5, got 0"):
        TissueParams(thumb_mpp=0)
    with pytest.raises(ConfigError, match=r"'tile_px'.*'big'"):
        parse_config(TileParams, {"tile_px": "big"}, source="run.json")
    parsed = parse_config(TileParams, {"tile_um": 96, "tissue": {"thumb_mpp": 4}}, source="run.json")
    assert parsed == TileParams(tile_um=96.0, tissue=TissueParams(thumb_mpp=4.0))
    assert isinstance(parsed.tile_um, float) and isinstance(parsed.tissue, TissueParams)


def test_dark_mode_filters_fit_a_fluorescence_tile() -> None:
    """On a dark-background slide a black tile is background (not "tissue" that looks blurry), sharp
    blue dots are sharp (luminance would weigh them 0.114), and the same dots blurred are blurry."""
    params = TileParams()
    black = np.full((1, 64, 64, 3), 5, np.uint8)
    rng = np.random.default_rng(0)
    dots = np.full((64, 64, 3), 5, np.float32)
    dots[..., 1] = 50  # dim tissue signal everywhere
    for y, x in rng.integers(4, 60, (40, 2)):
        dots[y - 2 : y + 2, x - 2 : x + 2, 2] = 230
    sharp = dots.astype(np.uint8)[None]
    blurred = ndimage.gaussian_filter(dots, (4, 4, 0)).astype(np.uint8)[None]
    assert classify_tiles(black, params, dark=True).tolist() == [BACKGROUND]
    assert classify_tiles(black, params).tolist() == [BLURRY]  # the H&E filters' silent verdict
    assert classify_tiles(sharp, params, dark=True).tolist() == [KEPT]
    assert classify_tiles(blurred, params, dark=True).tolist() == [BLURRY]
    assert blur_variance(sharp, white_level=220, dark=True)[0] > 10 * blur_variance(sharp, white_level=220)[0]

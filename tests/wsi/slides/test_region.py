"""The region plan (wsi/slides/region.py) that the CPU reader and the device decoder both follow."""

from __future__ import annotations

import pytest
from PIL import Image

from wsi.slides.region import RegionKind, RegionPlan, best_level, plan_region, resample_filter, tile_px_for

PYRAMID = (1.0, 4.0, 16.0)


def _plan(
    x0: int,
    y0: int,
    side_um: float,
    tile_px: int,
    mpp: float,
    downsamples: tuple[float, ...] = PYRAMID,
    **kw: bool,
) -> RegionPlan:
    return plan_region(
        x0, y0, side_um=side_um, target_mpp=side_um / tile_px, mpp=mpp, downsamples=downsamples, **kw
    )


def test_a_level_at_the_target_is_copied_from_its_pixel_grid() -> None:
    plan = _plan(4096, 2048, 256.0, 256, mpp=0.25)  # 1 um/px = level 1 of a 0.25 um/px scan
    assert (plan.level, plan.kind, plan.window) == (1, RegionKind.COPY, (1024, 512, 256, 256))
    # a 0.499 um/px scan serves 0.5 um/px directly: 0.2% scale error is inside SNAP_TOLERANCE
    plan = _plan(1000, 0, 128.0, 256, mpp=0.499, downsamples=(1.0,))
    assert (plan.kind, plan.window) == (RegionKind.COPY, (1000, 0, 256, 256))


def test_a_whole_multiple_is_reduced_by_blocks() -> None:
    plan = _plan(512, 1024, 256.0, 256, mpp=0.25, downsamples=(1.0,))  # no pyramid: 4 x 4 means
    assert (plan.kind, plan.factor, plan.window) == (RegionKind.REDUCE, 4, (512, 1024, 1024, 1024))


def test_other_sizes_are_resampled_with_the_filter_for_their_box() -> None:
    plan = _plan(4096, 2048, 256.0, 224, mpp=0.25)  # level 1, 256 level px -> 224 px
    assert plan.kind == RegionKind.RESAMPLE and plan.window == (1024, 512, 256, 256)
    assert plan.box() == (0.0, 0.0, 256.0)
    assert plan.resample_filter() == Image.Resampling.BILINEAR  # 1.14x is not a whole reduction
    off = _plan(4098, 2048, 256.0, 256, mpp=0.25)  # half a level pixel off the grid
    assert off.kind == RegionKind.RESAMPLE and off.origin == (0.5, 0.0) and off.window[2] == 257
    assert off.resample_filter() == Image.Resampling.BILINEAR
    assert resample_filter(2.0) == Image.Resampling.BOX and resample_filter(0.5) == Image.Resampling.BICUBIC


def test_a_reader_that_shifts_fractional_levels_gets_a_margin_and_no_snap() -> None:
    fractional = (1.0, 4.0005, 16.002)
    exact = _plan(0, 0, 256.0, 256, mpp=0.25, downsamples=fractional)
    assert exact.kind == RegionKind.COPY  # tiffslide / raw TIFF tiles: on the grid
    shifted = _plan(0, 0, 256.0, 256, mpp=0.25, downsamples=fractional, shifts_fractional_levels=True)
    assert shifted.kind == RegionKind.RESAMPLE and shifted.level == 1
    x, y, w, h = shifted.window
    assert (x, y) == (exact.window[0] - 1, exact.window[1] - 1) and w == h == 258
    bx, by, _ = shifted.box((0.3, 0.2))  # the reader's grid starts 0.3 / 0.2 px into the window
    assert bx == pytest.approx(shifted.origin[0] - 0.3) and by == pytest.approx(shifted.origin[1] - 0.2)
    # whole-number levels are exact for that reader too
    assert _plan(4096, 2048, 256.0, 256, mpp=0.25, shifts_fractional_levels=True).kind == RegionKind.COPY


def test_level_choice_and_bad_sizes() -> None:
    assert best_level(0.25, PYRAMID, 1.0) == 1 and best_level(0.25, PYRAMID, 0.9) == 0
    assert best_level(0.25, (1.0, 4.0005), 1.0) == 1  # within LEVEL_TOLERANCE
    assert best_level(0.25, PYRAMID, 100.0) == 2
    assert tile_px_for(256.0, 0.5) == 512
    with pytest.raises(ValueError, match="positive"):
        tile_px_for(0.0, 1.0)
    with pytest.raises(ValueError, match="less than one pixel"):
        plan_region(0, 0, side_um=0.1, target_mpp=1.0, mpp=0.25, downsamples=PYRAMID)

"""The region arithmetic of a tile read: which pyramid level, which window of it, and how that window
becomes the tile.

Why one module: a tile of `side_um` at `target_mpp` is read by `Slide.read_region_um` on the CPU
(openslide or tiffslide pixels, resized by PIL) and by the device decoder of the embed stage (raw JPEG
tiles of the TIFF, resized by torch). Both must pick the same level, the same window and the same
resampling, or the same tile would differ between tiling, embedding and prediction. They both ask
`plan_region` and carry out the `RegionPlan` it returns.

Public API:
  LEVEL_TOLERANCE, SNAP_TOLERANCE         how close a level must be to count as "fine enough" / "exact"
  best_level(mpp, downsamples, target_mpp) -> int     cheapest level at least as fine as the target
  tile_px_for(side_um, target_mpp) -> int             P, the output side in pixels (ValueError if < 1)
  check_tile_out(out, tile_px)     ValueError unless `out` can take a (P, P, 3) tile as a read writes it
  plan_region(x0_px, y0_px, *, side_um, target_mpp, mpp, downsamples, shifts_fractional_levels=False)
      -> RegionPlan
  RegionPlan      level, window (x, y, w, h in level px), kind (COPY | REDUCE | RESAMPLE), factor,
                  box(shift) and resample_filter(shift) of a RESAMPLE plan
  plan_regions(x0_px, y0_px, *, ...same keywords) -> RegionPlans    the plans of many tiles as arrays
  RegionPlans     win (N, 4), kind (N,), factor (N,), origin (N, 2); box() (N, 3), filters() (N,)
  resample_filter(reduction, off_grid=0.0) -> PIL.Image.Resampling
  tiffslide_loc(level_px, downsample) -> int   the level-0 x (or y) tiffslide reads level px `level_px` from
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from PIL import Image

from wsi.core.renamed import renamed_keywords

#: a level counts as "at least as fine" as the target when its um/px is within this fraction above it
#: (scanners write downsamples like 4.0005, which must still serve a target of 4 x level 0)
LEVEL_TOLERANCE = 0.01
#: scale error accepted to read a level directly (or reduce it by a whole factor) instead of resampling:
#: 0.3% is under 1.5 px across a 512 px tile, and serves the common 0.499 / 0.2527 um/px scans at the
#: usual 0.5 / 1.0 / 2.0 targets at the raw read rate
SNAP_TOLERANCE = 0.003
#: level-pixel slack for float noise in x0 / downsample (a whole-pixel position must stay whole)
_EPS = 1e-6
#: largest fraction of a level pixel by which a region may start off the grid and still be snapped
_ON_GRID = 1e-3


class RegionKind(IntEnum):
    """How a plan's window becomes the (P, P) tile."""

    COPY = 0  # the window is the tile: the level is (within SNAP_TOLERANCE) the target resolution
    REDUCE = 1  # the window is k*P px a side on the pixel grid: mean of k x k blocks
    RESAMPLE = 2  # antialiased resampling of the box (origin, side) of the window to P x P


@dataclass(frozen=True)
class RegionPlan:
    """What to read for one tile and how to turn it into P x P pixels (all positions in level px)."""

    level: int  # pyramid level to read
    tile_px: int  # P, the output side
    side_px: float  # the region's side at this level (a float: levels rarely match the target)
    x_px: int  # window top-left; may be negative or run past the level: outside is white glass
    y_px: int
    w_px: int  # window size
    h_px: int
    kind: RegionKind
    factor: int = 1  # k of a REDUCE plan (1 otherwise)
    origin: tuple[float, float] = (0.0, 0.0)  # the region's top-left inside the window (RESAMPLE)

    @property
    def window(self) -> tuple[int, int, int, int]:
        """(x, y, w, h) of the level rectangle to read."""
        return self.x_px, self.y_px, self.w_px, self.h_px

    def box(self, shift: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float, float]:
        """(bx, by, side): the region inside the pixels read, when the reader's pixel grid starts `shift`
        level px after the window's (openslide on a non-integer downsample; 0 for exact readers)."""
        return max(0.0, self.origin[0] - shift[0]), max(0.0, self.origin[1] - shift[1]), self.side_px

    def resample_filter(self, shift: tuple[float, float] = (0.0, 0.0)) -> Image.Resampling:
        """The filter of a RESAMPLE plan: box filtering only when the box sits on the pixel grid."""
        bx, by, side = self.box(shift)
        off_grid = max(abs(bx - round(bx)), abs(by - round(by)))
        return resample_filter(side / self.tile_px, off_grid)


def best_level(mpp: float, downsamples: Sequence[float], target_mpp: float) -> int:
    """The cheapest (coarsest) level whose um/px is at most `target_mpp` (within LEVEL_TOLERANCE).

    mpp: level-0 um/px; downsamples: each level's downsample from level 0 (level 0 first).
    """
    best = 0
    for level, ds in enumerate(downsamples):
        level_mpp = mpp * ds
        if level_mpp <= target_mpp * (1 + LEVEL_TOLERANCE) and level_mpp > mpp * downsamples[best]:
            best = level
    return best


def tile_px_for(side_um: float, target_mpp: float) -> int:
    """P = round(side_um / target_mpp), the tile side in output pixels; ValueError unless >= 1."""
    if side_um <= 0 or target_mpp <= 0:
        raise ValueError(f"side_um ({side_um}) and target_mpp ({target_mpp}) must be positive")
    p = round(side_um / target_mpp)
    if p < 1:
        raise ValueError(f"side_um {side_um} at target_mpp {target_mpp} is less than one pixel")
    return p


@renamed_keywords(size_um="side_um")
def plan_region(
    x0_px: int,
    y0_px: int,
    *,
    side_um: float,
    target_mpp: float,
    mpp: float,
    downsamples: Sequence[float],
    shifts_fractional_levels: bool = False,
) -> RegionPlan:
    """The plan for the square of `side_um` whose top-left is (x0_px, y0_px) in level-0 pixels.

    The level is `best_level(mpp, downsamples, target_mpp)`. When the region sits on that level's pixel
    grid and the level is, within SNAP_TOLERANCE, the target or a whole multiple k of it, the plan
    reads k*P px and copies (k = 1) or averages k x k blocks: no general resampling. Otherwise it reads
    the window covering the region and resamples it.

    shifts_fractional_levels: the reader's pixels of a level with a non-whole downsample (4.0005x) are
    shifted by a fraction of a pixel from the level's grid (openslide resamples them). Such a read
    never snaps, and its window keeps one pixel of margin so the shifted pixels still cover the region
    (the reader passes the shift to `box` / `resample_filter`). False: the pixels sit exactly on the
    grid (tiffslide, raw TIFF tiles).
    """
    p = tile_px_for(side_um, target_mpp)
    level = best_level(mpp, downsamples, target_mpp)
    ds = float(downsamples[level])
    exact_grid = not shifts_fractional_levels or ds.is_integer()
    lx, ly = x0_px / ds, y0_px / ds  # top-left in level pixels (float)
    side = side_um / (mpp * ds)  # region side in level pixels (float)
    ix, iy = math.floor(lx + _EPS), math.floor(ly + _EPS)
    k = max(1, round(side / p))
    on_grid = lx - ix < _ON_GRID and ly - iy < _ON_GRID
    if exact_grid and on_grid and abs(side - k * p) <= SNAP_TOLERANCE * side:
        kind = RegionKind.COPY if k == 1 else RegionKind.REDUCE
        return RegionPlan(level, p, side, ix, iy, k * p, k * p, kind, factor=k)
    margin = 0 if exact_grid else 1
    ix, iy = ix - margin, iy - margin
    w = math.ceil(lx - ix + side - _EPS) + margin
    h = math.ceil(ly - iy + side - _EPS) + margin
    return RegionPlan(level, p, side, ix, iy, w, h, RegionKind.RESAMPLE, origin=(lx - ix, ly - iy))


@dataclass(frozen=True)
class RegionPlans:
    """`plan_region` of many tiles of one slide at once, as arrays (the reader's hot path: no object per
    tile). Row i equals plan_region of tile i field for field (tests/wsi/slides/test_region.py checks it)."""

    level: int
    tile_px: int
    side_px: float
    win: np.ndarray  # (N, 4) int64 x, y, w, h in level px
    kind: np.ndarray  # (N,) int64 RegionKind
    factor: np.ndarray  # (N,) int64 k of a REDUCE plan, 1 otherwise
    origin: np.ndarray  # (N, 2) float64 the region's top-left inside the window (RESAMPLE), else 0

    def __len__(self) -> int:
        return len(self.kind)

    def box(self) -> np.ndarray:
        """(N, 3) float64 bx, by, side: RegionPlan.box() (no shift) of every RESAMPLE row, zeros elsewhere."""
        out = np.zeros((len(self), 3), np.float64)
        resample = self.kind == RegionKind.RESAMPLE
        out[resample, :2] = np.maximum(0.0, self.origin[resample])
        out[resample, 2] = self.side_px
        return out

    def filters(self) -> np.ndarray:
        """(N,) int64 PIL.Image.Resampling value of RegionPlan.resample_filter() (no shift) of every
        RESAMPLE row; -1 elsewhere."""
        box = self.box()
        off_grid = np.abs(box[:, :2] - np.round(box[:, :2])).max(axis=1)  # np.round: half to even, as round
        reduction = self.side_px / self.tile_px
        grid_filter = int(resample_filter(reduction, 0.0))
        off_filter = int(resample_filter(reduction, 1.0))  # off the grid: depends on the reduction only
        out = np.where(off_grid < 1e-3, grid_filter, off_filter).astype(np.int64)
        out[self.kind != RegionKind.RESAMPLE] = -1
        return out


@renamed_keywords(size_um="side_um")
def plan_regions(
    x0_px: np.ndarray,
    y0_px: np.ndarray,
    *,
    side_um: float,
    target_mpp: float,
    mpp: float,
    downsamples: Sequence[float],
    shifts_fractional_levels: bool = False,
) -> RegionPlans:
    """`plan_region` of every (x0_px[i], y0_px[i]) (level-0 px), as arrays; the same float arithmetic in
    the same order, so every row is identical to the scalar plan."""
    p = tile_px_for(side_um, target_mpp)
    level = best_level(mpp, downsamples, target_mpp)
    ds = float(downsamples[level])
    exact_grid = not shifts_fractional_levels or ds.is_integer()
    lx = np.asarray(x0_px, np.int64) / ds  # int -> float64 is exact below 2**53, like Python's int / float
    ly = np.asarray(y0_px, np.int64) / ds
    side = side_um / (mpp * ds)
    ix, iy = np.floor(lx + _EPS), np.floor(ly + _EPS)
    k = max(1, round(side / p))
    on_grid = (lx - ix < _ON_GRID) & (ly - iy < _ON_GRID)
    snap = on_grid & (exact_grid and abs(side - k * p) <= SNAP_TOLERANCE * side)
    margin = 0 if exact_grid else 1
    rx, ry = ix - margin, iy - margin  # RESAMPLE windows
    w = np.ceil(lx - rx + side - _EPS) + margin
    h = np.ceil(ly - ry + side - _EPS) + margin
    n = len(lx)
    win = np.empty((n, 4), np.int64)
    win[:, 0] = np.where(snap, ix, rx)
    win[:, 1] = np.where(snap, iy, ry)
    win[:, 2] = np.where(snap, k * p, w)
    win[:, 3] = np.where(snap, k * p, h)
    snapped = RegionKind.COPY if k == 1 else RegionKind.REDUCE
    kind = np.where(snap, int(snapped), int(RegionKind.RESAMPLE)).astype(np.int64)
    factor = np.where(snap, k, 1).astype(np.int64)
    origin = np.where(snap[:, None], 0.0, np.stack([lx - rx, ly - ry], axis=1))
    return RegionPlans(level, p, side, win, kind, factor, origin)


def tiffslide_loc(level_px: int, downsample: float) -> int:
    """The level-0 coordinate that tiffslide (int(loc / downsample)) maps to exactly `level_px`."""
    loc = math.ceil(level_px * downsample)
    while loc > 0 and int((loc - 1) / downsample) == level_px:
        loc -= 1
    while int(loc / downsample) < level_px:
        loc += 1
    return loc


def resample_filter(reduction: float, off_grid: float = 0.0) -> Image.Resampling:
    """Resampling filter for shrinking by `reduction` (input px per output px), the box `off_grid` px
    away from the input's pixel grid.

    PIL widens every filter by the reduction factor, so all of these antialias. Area averaging (BOX) is
    exact and about 4x cheaper than Lanczos for whole-number reductions on the pixel grid (2x, 4x); off
    the grid BOX snaps to whole pixels, so the triangle filter (smooth in sub-pixel shifts) is used;
    bicubic when enlarging.
    """
    on_grid = abs(reduction - round(reduction)) < 1e-3 and off_grid < 1e-3
    if reduction >= 1.0 and on_grid:
        return Image.Resampling.BOX
    if reduction >= 1.0:
        return Image.Resampling.BILINEAR
    return Image.Resampling.BICUBIC


def check_tile_out(out: np.ndarray, tile_px: int) -> None:
    """ValueError unless `out` can take a (P, P, 3) tile as `Slide.read_region_um` writes it."""
    shape = (tile_px, tile_px, 3)
    if not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != np.uint8:
        got = f"{out.dtype} array of shape {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise ValueError(f"out must be a uint8 array of shape {shape} for this tile, not a {got}")
    if not out.flags.c_contiguous:
        raise ValueError(
            f"out must be C-contiguous (as a row of a (k, P, P, 3) array), not {out.strides} strides"
        )
    if not out.flags.writeable:
        raise ValueError("out is read-only")

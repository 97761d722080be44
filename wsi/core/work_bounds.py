"""How much work one slide may cost, checked before it is done: numpy-free, so options can name the
limits without loading the imaging stack.

- The thumbnail: at most MAX_THUMB_PX pixels, made from a level of at most MAX_READ_PX pixels (the
  default of `wsi tile --max-read-gpx`); `wsi.slides.thumbnail.check_thumbnails` applies them.
- The tile grid: at most MAX_GRID_TILES cells (`check_grid`). The grid holds every whole cell of
  `tile_um` on the slide (`wsi.tiling.grid.make_grid`), about 100 bytes of arrays per cell while the tissue
  fractions are computed. A tiny --tile-um on a large slide (1 um tiles on 75 x 25 mm: 1.9 billion
  cells) used to end in numpy's "Unable to allocate 7.28 TiB"; here it is a SlideError naming the
  slide, the grid, the memory it would need and the option to change.
- A plain image read as a slide (`wsi.slides.plain_images`): streamed row by row into a tiled pyramid, so its
  size is not bounded; but a format that can only be decoded whole (an interlaced PNG, a progressive
  JPEG, a TIFF stored as one big strip) is refused above MAX_WHOLE_DECODE_PX pixels.
"""

from __future__ import annotations

import math

from wsi.core.errors import SlideError

#: the most cells of one slide's grid: 16.8 million (about 1.7 GB of arrays); a 75 x 25 mm slide cut
#: into 32 um tiles has 1.8 million
MAX_GRID_TILES = 1 << 24
_BYTES_PER_CELL = 100  # coordinates (px and um), the cells' boxes and fractions
#: the largest thumbnail (pixels): 16,384 x 16,384, 1 GiB with its masks; a 75 x 25 mm slide at the
#: default 8 um/px is 9,375 x 3,125
MAX_THUMB_PX = 1 << 28
#: the most pixels of one level decoded to make a thumbnail (4 gigapixels: a 63,000 px square slide
#: without a pyramid, about a minute); a slide with a pyramid reads a small level
MAX_READ_PX = 4 * 10**9
#: the most pixels of a plain image decoded at once (268 million: 0.8 GB of RGB, about as much again
#: of a progressive JPEG's coefficients); larger images are read in rows, or refused when they cannot be
MAX_WHOLE_DECODE_PX = 1 << 28


def grid_shape(width_px: int, height_px: int, *, mpp: float, tile_um: float) -> tuple[int, int]:
    """(n_cols, n_rows) of whole `tile_um` cells on a level-0 image of width_px x height_px at `mpp`."""
    step_px = tile_um / mpp
    # 1e-6 guards against 1000.0 / 0.25 / 4 style round-off dropping the last whole cell
    return max(0, math.floor(width_px / step_px + 1e-6)), max(0, math.floor(height_px / step_px + 1e-6))


def check_grid(name: object, width_px: int, height_px: int, *, mpp: float, tile_um: float) -> None:
    """SlideError naming `name` (the slide) when its grid of `tile_um` cells exceeds MAX_GRID_TILES."""
    if not (math.isfinite(tile_um) and tile_um > 0 and math.isfinite(mpp) and mpp > 0):
        raise SlideError(f"{name}: tile size {tile_um!r} um and mpp {mpp!r} must be positive numbers")
    n_cols, n_rows = grid_shape(width_px, height_px, mpp=mpp, tile_um=tile_um)
    if n_cols * n_rows > MAX_GRID_TILES:
        side = math.sqrt(width_px * mpp * height_px * mpp / MAX_GRID_TILES)
        raise SlideError(
            f"{name}: {width_px * mpp / 1000:.3g} x {height_px * mpp / 1000:.3g} mm cut into {tile_um:g} um "
            f"tiles is a grid of {n_cols} x {n_rows} = {n_cols * n_rows:,} tiles (about "
            f"{n_cols * n_rows * _BYTES_PER_CELL / 1e9:.3g} GB to place them); the most one slide takes is "
            f"{MAX_GRID_TILES:,}: raise --tile-um (tile_um) to {side * 1.01:.3g} or more"
        )


__all__ = [
    "MAX_GRID_TILES", "MAX_READ_PX", "MAX_THUMB_PX", "MAX_WHOLE_DECODE_PX", "check_grid", "grid_shape",
]  # fmt: skip

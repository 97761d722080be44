"""Whole-slide thumbnails that survive a corrupt tile: what cannot be decoded is marked, not fatal.

The tissue mask is computed on a thumbnail, so one corrupt JPEG tile in the level the thumbnail is read
from used to fail the whole slide, with the error placed at x=0 y=0 (the whole level was one read).
Here a level that fails as a whole is read again tile by tile of the file's own grid
(`wsi.slides.tiff_tiles`): only the tiles that fail are lost, white in the image and True in `unknown`, and
each is reported at its real level-0 place. The tile stage treats unknown as "maybe tissue": it tries those
tiles one by one and counts the ones that fail as unreadable, so the rest of the slide is tiled.

A slide's thumbnail work is bounded before any pixel is read (`check_thumbnails`): the thumbnail itself
at most MAX_THUMB_PX pixels (else: raise --thumb-mpp), and the pyramid level it is made from at most
`max_read_px` pixels (default MAX_READ_PX). A file whose header declares far more pixels than it holds
(a 7 MB TIFF of 200,000 x 200,000 px, its tiles empty) and has no coarser level would otherwise take
time in proportion to the declared size: it is refused at once, naming its size, the limit, and the two
ways out (give it a pyramid, or raise the limit: `wsi tile --max-read-gpx`).

Public API:
  read_thumbnail(slide, mpp) -> Thumbnail
  read_thumbnails(slide, mpps, max_read_px=MAX_READ_PX) -> tuple[Thumbnail, ...]   several sizes, each
      level read once, one warning
  check_thumbnails(slide, mpps, max_read_px=MAX_READ_PX)   the bounds above, SlideError naming the slide
  Thumbnail(image (h,w,3) uint8, unknown (h,w) bool, mpp, unreadable: tuple[UnreadableRegion, ...])
  UnreadableRegion(x_px, y_px, w_px, h_px, level, error)   level-0 px; .describe() (`wsi.slides.tiff_tiles`)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from wsi.core.errors import SlideError
from wsi.core.work_bounds import MAX_READ_PX, MAX_THUMB_PX
from wsi.slides.region import resample_filter
from wsi.slides.tiff_tiles import (
    UnreadableRegion,
    describe_regions,
    distinct_regions,
    file_tile_px,
    read_by_file_tiles,
)

if TYPE_CHECKING:
    from wsi.slides.slide import Slide

__all__ = [
    "MAX_READ_PX", "MAX_THUMB_PX", "MAX_THUMB_READ_PX", "Thumbnail", "UnreadableRegion", "check_thumbnails",
    "read_thumbnail", "read_thumbnails",
]  # fmt: skip

log = logging.getLogger(__name__)

#: thumbnails from a level larger than this (pixels) are assembled block by block (memory)
MAX_THUMB_READ_PX = 1 << 26
_WHITE = 255
_Read = tuple[np.ndarray, np.ndarray, list[UnreadableRegion]]  # image, unknown mask, unreadable regions


@dataclass(frozen=True)
class Thumbnail:
    """A whole-slide thumbnail and what of it could not be read."""

    image: np.ndarray  # (h, w, 3) uint8 RGB; unreadable parts white
    unknown: np.ndarray  # (h, w) bool: True where the slide could not be read (not "background")
    mpp: float  # um/px of the thumbnail (level-0 width * mpp / w)
    unreadable: tuple[UnreadableRegion, ...] = ()  # where and why, in level-0 px

    @property
    def n_unreadable(self) -> int:
        return len(self.unreadable)


def check_thumbnails(slide: Slide, mpps: Sequence[float], max_read_px: int = MAX_READ_PX) -> None:
    """SlideError naming the slide, its size, the limit and the way out when a thumbnail at one of
    `mpps` um/px would be larger than MAX_THUMB_PX or be made from a level of more than `max_read_px`
    pixels (see the module docstring)."""
    w0, h0 = slide.dimensions
    mm = f"{w0 * slide.mpp / 1000:.3g} x {h0 * slide.mpp / 1000:.3g} mm"
    size = f"{w0} x {h0} px at {slide.mpp:g} um/px ({mm})"
    for mpp in mpps:
        if not mpp > 0:
            raise ValueError(f"thumbnail mpp must be positive, not {mpp}")
        w, h = _size(slide, mpp)
        if w * h > MAX_THUMB_PX:
            need = w * h * 4 / 2**30  # RGB + the unknown mask, before the tissue mask's working copies
            raise SlideError(
                f"{slide.path}: a thumbnail of this {size} slide at {mpp:g} um/px would be {w} x {h} px "
                f"({need:.1f} GiB of memory); the most a thumbnail holds is {MAX_THUMB_PX} px: raise "
                f"--thumb-mpp (tissue.thumb_mpp) to {_mpp_for(slide, MAX_THUMB_PX):.3g} or more"
            )
        level = slide.best_level_for_mpp(mpp)
        lw, lh = slide.level_dimensions[level]
        if lw * lh > max_read_px:
            where = "level 0 (it has no coarser level)" if len(slide.level_dimensions) == 1 else (
                f"level {level} of {len(slide.level_dimensions)} ({lw} x {lh} px)")  # fmt: skip
            raise SlideError(
                f"{slide.path}: declares {size}{_held(slide)}; its thumbnail at {mpp:g} um/px would be made "
                f"from {where}, decoding {lw * lh / 1e9:.3g} gigapixels, more than the limit of "
                f"{max_read_px / 1e9:.3g}. Give the slide a pyramid (e.g. `vips tiffsave SLIDE out.tif "
                "--tile --pyramid --compression jpeg --bigtiff`) or raise the limit (`wsi tile "
                f"--max-read-gpx {math.ceil(lw * lh / 1e9)}`: about a minute per 4 gigapixels)"
            )


def _held(slide: Slide) -> str:
    """', the file holds 7.3 MB' for a one-file slide (what a forged header declares is not there)."""
    try:
        file = slide.file  # a remote slide's: its local copy, or the RangeFile with its size
        if isinstance(file, Path) and file.is_file():
            return f", the file holds {file.stat().st_size / 1e6:.3g} MB"
        if not isinstance(file, Path):
            return f", the file holds {file.size / 1e6:.3g} MB"
    except OSError:
        pass
    return ""


def _mpp_for(slide: Slide, max_px: int) -> float:
    """The finest um/px whose thumbnail has at most `max_px` pixels."""
    w0, h0 = slide.dimensions
    return slide.mpp * math.sqrt(w0 * h0 / max_px) * 1.01


def read_thumbnail(slide: Slide, mpp: float) -> Thumbnail:
    """The whole slide at about `mpp` um/px, read from the coarsest level fine enough.

    Unreadable parts are white in `image`, True in `unknown`, listed in `unreadable` and named in a
    warning. Only a slide of which nothing can be read raises SlideError.
    """
    return read_thumbnails(slide, (mpp,))[0]


def read_thumbnails(
    slide: Slide, mpps: Sequence[float], max_read_px: int = MAX_READ_PX
) -> tuple[Thumbnail, ...]:
    """The whole slide at each of `mpps` um/px (e.g. the tissue-mask thumbnail and a finer QC picture),
    with each level read once, and one warning naming every unreadable region of them all. Bounded by
    `check_thumbnails` first."""
    check_thumbnails(slide, mpps, max_read_px)
    levels = [slide.best_level_for_mpp(mpp) for mpp in mpps]
    thumbs: dict[int, Thumbnail] = {}
    for level in dict.fromkeys(levels):  # one level at a time: at most one level image in memory
        whole: _Read | None = None
        for i, mpp in enumerate(mpps):
            if levels[i] != level:
                continue
            lw, lh = slide.level_dimensions[level]
            if lw * lh > MAX_THUMB_READ_PX:
                thumbs[i] = _finish(slide, mpp, _by_blocks(slide, mpp, _size(slide, mpp), level))
                continue
            if whole is None:
                whole = _level_recovering(slide, level)
            thumbs[i] = _finish(slide, mpp, _resized(whole, _size(slide, mpp)))
    out = tuple(thumbs[i] for i in range(len(mpps)))
    bad = distinct_regions(*(t.unreadable for t in out))
    if bad:
        log.warning(
            "%s: %d region(s) cannot be decoded; marked unknown on the tissue thumbnail (their tiles are "
            "tried one by one, and counted unreadable when they fail): %s (%s)",
            slide.path, len(bad), describe_regions(bad, 5), bad[0].error,
        )  # fmt: skip
    return out


def _size(slide: Slide, mpp: float) -> tuple[int, int]:
    w0, h0 = slide.dimensions
    return max(1, round(w0 * slide.mpp / mpp)), max(1, round(h0 * slide.mpp / mpp))


def _resized(read: _Read, size: tuple[int, int]) -> _Read:
    """A level read brought to `size` (w, h); a pixel is unknown when any level pixel under it is."""
    image, unknown, bad = read
    lh, lw = image.shape[:2]
    if size == (lw, lh):
        return read
    image = np.asarray(Image.fromarray(image).resize(size, resample=resample_filter(lw / size[0])))
    if unknown.any():
        mask = Image.fromarray(unknown.astype(np.uint8) * 255).resize(size, Image.Resampling.BOX)
        unknown = np.asarray(mask) > 0
    else:
        unknown = np.zeros((size[1], size[0]), bool)
    return image, unknown, bad


def _finish(slide: Slide, mpp: float, read: _Read) -> Thumbnail:
    image, unknown, bad = read
    if bad and unknown.all():
        raise SlideError(f"{slide.path}: no part of the slide can be read: {bad[0].error}")
    return Thumbnail(image, unknown, slide.dimensions[0] * slide.mpp / image.shape[1], tuple(bad))


def _level_recovering(slide: Slide, level: int) -> _Read:
    """A whole level; when that fails, again tile by tile of the file's own grid, so that a corrupt
    tile costs only itself and is reported where it is. (image, unknown mask, unreadable regions)"""
    lw, lh = slide.level_dimensions[level]
    try:
        return slide.read_level(level, 0, 0, lw, lh), np.zeros((lh, lw), bool), []
    except SlideError:
        log.debug("%s: level %d unreadable as a whole; reading it tile by tile", slide.path, level)
    return read_by_file_tiles(slide, level, (0, 0, lw, lh))


def _by_blocks(
    slide: Slide, mpp: float, size: tuple[int, int], level: int, read_px: int = 4096
) -> tuple[np.ndarray, np.ndarray, list[UnreadableRegion]]:
    """Thumbnail of a slide whose suitable level is too big to read at once (no pyramid).

    Blocks are sized so that each read is at most `read_px` pixels a side at the level read; a block
    that fails is read again in pieces of about the file's tile size, so a corrupt tile costs about
    itself only.
    """
    block_px = max(1, int(read_px * slide.level_mpp(level) / mpp))  # thumbnail px per block
    piece_px = max(1, int(max(file_tile_px(slide, level)) * slide.level_mpp(level) / mpp))
    out = np.full((size[1], size[0], 3), _WHITE, np.uint8)
    unknown = np.zeros((size[1], size[0]), bool)
    bad: list[UnreadableRegion] = []
    for by in range(0, size[1], block_px):
        for bx in range(0, size[0], block_px):
            if _block(slide, out, mpp, (bx, by), block_px, level, None):
                continue
            for py in range(by, min(by + block_px, size[1]), piece_px):
                for px in range(bx, min(bx + block_px, size[0]), piece_px):
                    if not _block(slide, out, mpp, (px, py), piece_px, level, bad):
                        unknown[py : py + piece_px, px : px + piece_px] = True
    return out, unknown, bad


def _block(
    slide: Slide,
    out: np.ndarray,
    mpp: float,
    at: tuple[int, int],
    side: int,
    level: int,
    bad: list[UnreadableRegion] | None,
) -> bool:
    """Read one square of the thumbnail into `out`; False (and, given `bad`, a region) when it fails."""
    bx, by = at
    x0, y0 = round(bx * mpp / slide.mpp), round(by * mpp / slide.mpp)
    try:
        block = slide.read_region_um(x0, y0, side * mpp, mpp)
    except SlideError as exc:
        if bad is not None:
            side0 = round(side * mpp / slide.mpp)
            bad.append(UnreadableRegion(x0, y0, side0, side0, level=level, error=str(exc)))
        return False
    h, w = out.shape[:2]
    out[by : by + side, bx : bx + side] = block[: h - by, : w - bx]
    return True

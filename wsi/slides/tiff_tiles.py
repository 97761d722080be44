"""The file's own tiles: the JPEG (or other) tiles a slide file stores each level in, and which of them
cannot be decoded.

A slide file is damaged tile by tile: each stored tile is compressed on its own, so one corrupt tile
(a bad sector, a cut copy, a flipped bit) costs the reads that touch it and nothing else. Reading a
failed rectangle again one stored tile at a time says which tiles are bad and where (level-0 px, to
report), and counting them against the stored tiles under the tissue says how much of the file is
damaged (`FileDamage`: the tile stage's rule for failing a slide, see `FileDamage.too_much`).

Public API:
  UnreadableRegion(x_px, y_px, w_px, h_px, level, error)   level-0 px; .describe(), .as_list()
  file_tile_px(slide, level) -> (w, h)          stored tile size; 512 x 512 when the backend does not say
  read_by_file_tiles(slide, level, window) -> (image, unknown, regions)   a level rectangle, tile by tile
  FileTileProbe(slide, level)                   .locate(window) -> regions; .regions (thread-safe cache)
  file_tiles_under(slide, level, boxes_px) -> int   stored tiles covered by level-0 boxes
  FileDamage(n_bad, n_tissue, level, tile_px, regions)   .fraction, .too_much(max_fraction), .describe()
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from wsi.core.errors import SlideError

if TYPE_CHECKING:
    from wsi.slides.slide import Slide

_WHITE = 255
#: read size when the backend does not say how the file is tiled (a stripped TIFF, some formats)
_DEFAULT_TILE_PX = 512
#: regions named in one message; the rest are counted
SHOWN_REGIONS = 3


@dataclass(frozen=True)
class UnreadableRegion:
    """A part of a slide that could not be decoded (e.g. a corrupt JPEG tile), in level-0 px."""

    x_px: int  # level-0 left
    y_px: int  # level-0 top
    w_px: int  # level-0 width
    h_px: int  # level-0 height
    level: int  # the pyramid level whose read failed
    error: str  # the backend's message

    def describe(self) -> str:
        return f"level-0 x={self.x_px} y={self.y_px} ({self.w_px} x {self.h_px} px, level {self.level})"

    def as_list(self) -> list[int]:
        """[x, y, w, h, level]: the form stored in tile files (`unreadable_regions`, JSON)."""
        return [self.x_px, self.y_px, self.w_px, self.h_px, self.level]

    @property
    def key(self) -> tuple[int, int, int, int, int]:
        return self.x_px, self.y_px, self.w_px, self.h_px, self.level


def describe_regions(regions: Sequence[UnreadableRegion], shown: int = SHOWN_REGIONS) -> str:
    """'level-0 x=.. y=.. (w x h px, level l); ...; and N more' for a message."""
    text = "; ".join(r.describe() for r in regions[:shown])
    return text + (f"; and {len(regions) - shown} more" if len(regions) > shown else "")


def distinct_regions(*groups: Sequence[UnreadableRegion]) -> tuple[UnreadableRegion, ...]:
    """The regions of all `groups`, each place once, sorted by level, row, column."""
    seen: dict[tuple[int, int, int, int, int], UnreadableRegion] = {}
    for group in groups:
        for region in group:
            seen.setdefault(region.key, region)
    return tuple(sorted(seen.values(), key=lambda r: (r.level, r.y_px, r.x_px)))


def file_tile_px(slide: Slide, level: int) -> tuple[int, int]:
    """The file's own tile size at `level` (px) as the backend reports it; 512 x 512 when it does not."""
    sizes = []
    for side in ("width", "height"):
        try:
            sizes.append(int(float(slide.properties.get(f"{slide.backend}.level[{level}].tile-{side}", ""))))
        except ValueError:
            return _DEFAULT_TILE_PX, _DEFAULT_TILE_PX
    w, h = sizes
    return (w, h) if w > 0 and h > 0 else (_DEFAULT_TILE_PX, _DEFAULT_TILE_PX)


def _region(slide: Slide, level: int, box: tuple[int, int, int, int], error: str) -> UnreadableRegion:
    """A level rectangle (x, y, w, h in level px) as an UnreadableRegion in level-0 px."""
    ds = slide.level_downsamples[level]
    x, y, w, h = box
    return UnreadableRegion(round(x * ds), round(y * ds), round(w * ds), round(h * ds), level, error)


def _tiles_in(slide: Slide, level: int, window: tuple[int, int, int, int]) -> list[tuple[int, int, int, int]]:
    """The stored tiles (x, y, w, h in level px, cut to the level) that a level window touches."""
    lw, lh = slide.level_dimensions[level]
    tw, th = file_tile_px(slide, level)
    x, y, w, h = window
    x0, y0, x1, y1 = max(0, x), max(0, y), min(lw, x + w), min(lh, y + h)
    return [
        (tx, ty, min(tw, lw - tx), min(th, lh - ty))
        for ty in range(y0 // th * th, y1, th)
        for tx in range(x0 // tw * tw, x1, tw)
    ]


def read_by_file_tiles(
    slide: Slide, level: int, window: tuple[int, int, int, int]
) -> tuple[np.ndarray, np.ndarray, list[UnreadableRegion]]:
    """A level rectangle (x, y, w, h in level px) read one stored tile at a time, so that a corrupt tile
    costs only itself: (image (h, w, 3) uint8, white where unreadable; unknown (h, w) bool; regions, one
    per stored tile that failed, in level-0 px)."""
    x, y, w, h = window
    image = np.full((h, w, 3), _WHITE, np.uint8)
    unknown = np.zeros((h, w), bool)
    bad: list[UnreadableRegion] = []
    for tx, ty, tw, th in _tiles_in(slide, level, window):
        cx0, cy0 = max(tx, x), max(ty, y)
        cx1, cy1 = min(tx + tw, x + w), min(ty + th, y + h)
        part = (slice(cy0 - y, cy1 - y), slice(cx0 - x, cx1 - x))
        try:
            image[part] = slide.read_level(level, cx0, cy0, cx1 - cx0, cy1 - cy0)
        except SlideError as exc:
            unknown[part] = True
            bad.append(_region(slide, level, (tx, ty, tw, th), str(exc)))
    return image, unknown, bad


class FileTileProbe:
    """Finds the stored tiles behind failed reads of one level; thread-safe, each tile tried once.

    The tile stage reads many tiles per stored tile (and a 240 px stored tile lies under up to four
    256 um tiles), so each stored tile's verdict is cached.
    """

    def __init__(self, slide: Slide, level: int) -> None:
        self.slide = slide
        self.level = level
        self._verdicts: dict[tuple[int, int], UnreadableRegion | None] = {}  # stored tile's (x, y) -> bad?
        self._other: list[UnreadableRegion] = []  # failed reads whose stored tiles all decode alone
        self._lock = threading.Lock()

    def locate(self, window: tuple[int, int, int, int], error: str) -> list[UnreadableRegion]:
        """The stored tiles under a failed read of `window` (level px) that cannot be decoded; when each
        decodes on its own, the window itself (the read failed for another reason: `error`)."""
        bad = []
        for tx, ty, tw, th in _tiles_in(self.slide, self.level, window):
            with self._lock:
                known = (tx, ty) in self._verdicts
                verdict = self._verdicts.get((tx, ty))
            if not known:
                try:
                    self.slide.read_level(self.level, tx, ty, tw, th)
                    verdict = None
                except SlideError as exc:
                    verdict = _region(self.slide, self.level, (tx, ty, tw, th), str(exc))
                with self._lock:
                    self._verdicts[(tx, ty)] = verdict
            if verdict is not None:
                bad.append(verdict)
        if not bad:
            lw, lh = self.slide.level_dimensions[self.level]
            x, y, w, h = window
            x0, y0 = max(0, x), max(0, y)
            region = _region(
                self.slide, self.level, (x0, y0, min(lw, x + w) - x0, min(lh, y + h) - y0), error
            )
            with self._lock:
                self._other.append(region)
            bad.append(region)
        return bad

    @property
    def regions(self) -> tuple[UnreadableRegion, ...]:
        """Every distinct unreadable region found so far, sorted."""
        with self._lock:
            found = [r for r in self._verdicts.values() if r is not None]
            other = list(self._other)
        return distinct_regions(found, other)


def file_tiles_under(slide: Slide, level: int, boxes_px: np.ndarray) -> int:
    """How many stored tiles of `level` the (N, 4) level-0 boxes (x0, y0, x1, y1, half-open) cover."""
    if len(boxes_px) == 0:
        return 0
    lw, lh = slide.level_dimensions[level]
    tw, th = file_tile_px(slide, level)
    ds = slide.level_downsamples[level]
    n_cols, n_rows = math.ceil(lw / tw), math.ceil(lh / th)
    b = np.asarray(boxes_px, np.float64) / ds  # (N, 4) in level px
    c0 = np.clip(np.floor(b[:, 0] / tw), 0, n_cols).astype(np.int64)
    r0 = np.clip(np.floor(b[:, 1] / th), 0, n_rows).astype(np.int64)
    c1 = np.clip(np.ceil(b[:, 2] / tw), 0, n_cols).astype(np.int64)  # exclusive
    r1 = np.clip(np.ceil(b[:, 3] / th), 0, n_rows).astype(np.int64)
    # 2-D difference array: +1 at each box's top-left, -1 past its right and bottom; two cumsums fill it
    marks = np.zeros((n_rows + 1, n_cols + 1), np.int64)
    np.add.at(marks, (r0, c0), 1)
    np.add.at(marks, (r0, c1), -1)
    np.add.at(marks, (r1, c0), -1)
    np.add.at(marks, (r1, c1), 1)
    return int(np.count_nonzero(marks.cumsum(0).cumsum(1)[:n_rows, :n_cols] > 0))


@dataclass(frozen=True)
class FileDamage:
    """How much of a slide file the tile stage found undecodable, counted in the file's own tiles.

    Why stored tiles and not our tiles: corruption happens per stored tile, and one bad 240 px JPEG tile
    lies under up to four 256 um tiles; on a small slide with ten tissue tiles that is 40% of the
    tissue, yet one tile out of the ~80 the file stores there. Counting stored tiles makes the rule the
    same for any --tile-um.
    """

    n_bad: int  # distinct unreadable stored tiles (or failed windows) found under the tissue tiles
    n_tissue: int  # stored tiles under the tissue tiles, at the level the tiles are read from
    level: int  # that level
    tile_px: tuple[int, int]  # its stored tile size (w, h)
    regions: tuple[UnreadableRegion, ...] = ()  # where, level-0 px

    @property
    def fraction(self) -> float:
        return self.n_bad / max(1, self.n_tissue)

    def too_much(self, max_fraction: float) -> bool:
        """Damaged beyond use: more than `max_fraction` of the stored tiles under the tissue are bad.

        One bad stored tile is an isolated defect, never "a damaged file", unless `max_fraction` is 0
        (every bad tile fails the slide): the tolerance is at least one whole tile, since a fraction of
        a tile cannot be tolerated on a slide with few tiles.
        """
        tolerated = max(max_fraction * self.n_tissue, 1.0 if max_fraction > 0 else 0.0)
        return self.n_bad > tolerated

    def describe(self) -> str:
        """'N of the M file tiles (w x h px, level l) under the tissue could not be decoded (f%)'."""
        tw, th = self.tile_px
        return (
            f"{self.n_bad} of the {self.n_tissue} file tiles ({tw} x {th} px, level {self.level}) under the "
            f"tissue could not be decoded ({self.fraction:.1%})"
        )

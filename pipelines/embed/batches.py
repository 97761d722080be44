"""What flows through the embed stream: a slide's tiles to read, and the batches the readers send.

These types sit apart from the modules that make and use them (feed.py reads, device_decode/ decodes,
engine.py encodes) so that each of those imports them and none imports another to learn its types.
All three are small and picklable: reader processes send them to the main process.

Public API:
  SlideTiles      one slide's tiles: coords, reading parameters, optional complete zarr cache
  slide_tiles_from_tile_file(tile_file, *, use_cache=True) -> SlideTiles
  TileBatch       (slide_index, start, tiles (b,P,P,3) uint8, ok (b,) bool, error, raw: RawBatch | None)
  RawBatch        one batch as compressed JPEG streams plus the per-tile region plans to decode them
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal, NamedTuple

import numpy as np
import torch

from wsi.core.suffixes import TILE_PIXELS_SUFFIX
from wsi.formats.tile_file import TileFile, pixels_complete


@dataclass(frozen=True)
class SlideTiles:
    """Everything a reader needs for one slide; small and picklable (sent to reader processes)."""

    slide_id: str
    slide_path: str
    backend: str
    mpp: float  # level-0 um/px used by the tile stage (may have come from --mpp)
    tile_um: float
    target_mpp: float
    tile_px: int
    coords_px: np.ndarray  # (N, 2) int64 level-0 top-left
    pixels_path: str | None = None  # complete zarr cache of (N, P, P, 3), or None: read the slide
    decode: Literal["cpu", "device"] = "cpu"  # device: readers send raw JPEG tiles (device_decode/)

    @property
    def n(self) -> int:
        return len(self.coords_px)


def slide_tiles_from_tile_file(tile_file: TileFile, *, use_cache: bool = True) -> SlideTiles:
    """The tiles of a tile file, read from its `--save-tiles` cache when that is complete."""
    pixels = tile_file.path.with_suffix(TILE_PIXELS_SUFFIX)
    cached = use_cache and pixels_complete(pixels, len(tile_file))
    return SlideTiles(
        slide_id=tile_file.slide_id,
        slide_path=tile_file.slide_path,
        backend=tile_file.meta.backend,
        mpp=tile_file.mpp,
        tile_um=tile_file.tile_um,
        target_mpp=tile_file.target_mpp,
        tile_px=tile_file.tile_px,
        coords_px=np.asarray(tile_file.coords, dtype=np.int64),
        pixels_path=str(pixels) if cached else None,
    )


@dataclass
class RawBatch:
    """One batch of one slide as compressed JPEG streams plus the plan to turn them into tiles.

    Windows are `wsi.slides.region.plan_region`'s, in level px: window b starts at (ix, iy), is (n_w, n_h) px,
    and the output tile comes from it by `kind` (a `RegionKind`: copy P x P, reduce k x k blocks, or
    resample box (bx, by, side) with the PIL filter `filt`). `table[b]` maps the JPEG grid cells the
    window touches (from its first cell (gx0, gy0)) to stream slots; -1 is white. Stream j is
    data[offsets[j] : offsets[j] + lengths[j]]. Everything per tile or per stream is an array: a batch
    pickles (reader process -> main process) without one Python object per tile.
    """

    slide_path: str
    backend: str
    mpp: float
    side_um: float
    target_mpp: float
    tile_px: int
    coords_px: np.ndarray  # (B, 2) level-0 top-left (for the CPU fallback)
    level: int
    level_wh: tuple[int, int]
    tile_wh: tuple[int, int]
    data: torch.Tensor  # (total,) uint8: the complete JPEG streams
    offsets: np.ndarray  # (J,) int64 start of each stream in data
    lengths: np.ndarray  # (J,) int64 bytes of each stream; 0: unusable (missing or not a JPEG)
    cells: np.ndarray  # (J, 2) int64 (col, row) of each stream in the level's tile grid
    win: np.ndarray  # (B, 4) int64 ix, iy, n_w, n_h
    box: np.ndarray  # (B, 3) float64 bx, by, side
    kind: np.ndarray  # (B,) int64 RegionKind
    factor: np.ndarray  # (B,) int64 k of RegionKind.REDUCE
    filt: np.ndarray  # (B,) int64 PIL.Image.Resampling of RegionKind.RESAMPLE (-1 for the others)
    grid0: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))  # (B, 2) gx0, gy0
    table: np.ndarray = field(default_factory=lambda: np.zeros((0, 1, 1), np.int64))  # (B, GH, GW)

    def stream(self, j: int) -> torch.Tensor:
        """(lengths[j],) uint8 view of stream j."""
        o = int(self.offsets[j])
        return self.data[o : o + int(self.lengths[j])]

    def pin_memory(self) -> RawBatch:  # called by DataLoader(pin_memory=True)
        return replace(self, data=self.data.pin_memory())

    def __len__(self) -> int:
        return len(self.coords_px)


class TileBatch(NamedTuple):
    """One batch of one slide as the feed yields it."""

    slide_index: int
    start: int
    tiles: torch.Tensor  # (b, P, P, 3) uint8
    ok: torch.Tensor  # (b,) bool; False: the tile could not be read (its pixels are zeros)
    error: str  # non-empty: the whole slide could not be opened
    raw: RawBatch | None = None  # compressed tiles to decode on the device; `tiles` is then (b, 0, 0, 3)

"""Raw tile reading: the compressed JPEG tiles a batch of regions needs, sliced out of the TIFF.

Runs in the reader workers, which then do no decoding at all: per region they ask
`wsi.region.plan_region` for the window (the same plan `Slide.read_region_um` follows), and send the
few kB of JPEG data under those windows with the plans (`RawBatch`) to the main process.

Public API:
  JpegLevel                                  the TIFF page of one pyramid level, as raw tiles
  find_jpeg_level(path, level, dims) -> JpegLevel | None       None unless a tiled 8-bit RGB JPEG page
  RawSlideReader.open(st: SlideTiles) -> RawSlideReader | None  None: not a tiled JPEG TIFF (CPU path)
  RawSlideReader.read(start, stop) -> RawBatch
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from wsi.jpeg_colour import Colour, colour_to_decode
from wsi.pipelines.embed.batches import RawBatch, SlideTiles
from wsi.pipelines.embed.device_decode.jpeg import SOI, complete_jpeg
from wsi.region import RegionKind, RegionPlan, plan_region
from wsi.slide import is_tiff, open_slide
from wsi.slide_colour import first_tile

log = logging.getLogger(__name__)

_JPEG = 7  # TIFF Compression tag value of "new-style" JPEG (Aperio, tifffile, libtiff)
_PHOTOMETRIC_RGB = 2


@dataclass(frozen=True)
class JpegLevel:
    """The TIFF page holding one pyramid level, as raw tiles."""

    level: int
    width: int
    height: int
    tile_w: int
    tile_h: int
    offsets: np.ndarray  # (n_rows * n_cols,) int64 byte offsets, row-major
    counts: np.ndarray  # (n_rows * n_cols,) int64 byte counts
    tables: bytes | None  # JPEGTables tag of abbreviated streams
    rgb: bool  # the tiles hold RGB (Aperio), not YCbCr: their stream's own markers, else the photometric

    @property
    def n_cols(self) -> int:
        return math.ceil(self.width / self.tile_w)


def find_jpeg_level(path: str, level: int, dims: tuple[int, int]) -> JpegLevel | None:
    """The tiled TIFF page of the given (width, height); None unless it is 8-bit 3-sample JPEG."""
    import tifffile

    try:
        with tifffile.TiffFile(path) as tif:
            for page in tif.pages:
                if not isinstance(page, tifffile.TiffPage):
                    continue  # a TiffFrame: never a level's own page
                if not page.is_tiled or (page.imagewidth, page.imagelength) != tuple(dims):
                    continue
                ok = (
                    int(page.compression) == _JPEG
                    and page.samplesperpixel == 3
                    and page.bitspersample == 8
                    and page.imagedepth == 1
                    and int(page.planarconfig) == 1
                )
                if not ok:
                    return None
                # a JFIF (YCbCr) tile under an RGB photometric tag is decoded as YCbCr, as read_region_um
                # decodes it (wsi.slide_colour); an Aperio tile (no marker, 4:4:4) as the tag says
                photometric: Colour = "rgb" if int(page.photometric) == _PHOTOMETRIC_RGB else "ycbcr"
                rgb = colour_to_decode(first_tile(tif.filehandle, page), photometric) == "rgb"
                return JpegLevel(
                    level=level, width=int(page.imagewidth), height=int(page.imagelength),
                    tile_w=int(page.tilewidth), tile_h=int(page.tilelength),
                    offsets=np.asarray(page.dataoffsets, np.int64),
                    counts=np.asarray(page.databytecounts, np.int64),
                    tables=page.jpegtables, rgb=rgb,
                )  # fmt: skip
    except Exception:  # not a TIFF tifffile parses: the CPU path decides
        log.debug("%s: tifffile could not map level %d", path, level, exc_info=True)
    return None


@dataclass
class _Plans:
    """The region plans of one batch as arrays (the fields of RawBatch that describe the windows)."""

    win: np.ndarray  # (B, 4) int64 ix, iy, n_w, n_h
    box: np.ndarray  # (B, 3) float64 bx, by, side
    kind: np.ndarray  # (B,) int64 RegionKind
    factor: np.ndarray  # (B,) int64
    filt: list[str]  # (B,) PIL filter name of RESAMPLE plans

    @classmethod
    def of(cls, plans: list[RegionPlan]) -> _Plans:
        b = len(plans)
        out = cls(np.zeros((b, 4), np.int64), np.zeros((b, 3), np.float64), np.zeros(b, np.int64),
                  np.ones(b, np.int64), [""] * b)  # fmt: skip
        for j, plan in enumerate(plans):
            out.win[j] = plan.window
            out.kind[j], out.factor[j] = int(plan.kind), plan.factor
            if plan.kind == RegionKind.RESAMPLE:  # raw TIFF pixels sit on the level's grid: no shift
                out.box[j] = plan.box()
                out.filt[j] = plan.resample_filter().name
        return out


class RawSlideReader:
    """Slices the compressed JPEG tiles of the level `read_region_um` would use out of a TIFF slide."""

    def __init__(self, st: SlideTiles, level: JpegLevel, downsamples: tuple[float, ...]) -> None:
        self.st = st
        self.lv = level
        self.downsamples = downsamples
        self._fd = os.open(st.slide_path, os.O_RDONLY)

    @classmethod
    def open(cls, st: SlideTiles) -> RawSlideReader | None:
        """A reader, or None when the level to read is not an 8-bit RGB tiled JPEG page (CPU path)."""
        if not is_tiff(Path(st.slide_path)):
            return None
        with open_slide(st.slide_path, backend=st.backend, mpp=st.mpp) as slide:
            level = slide.best_level_for_mpp(st.target_mpp)
            dims = slide.level_dimensions[level]
            downsamples = slide.level_downsamples
        found = find_jpeg_level(st.slide_path, level, dims)
        if found is None:
            log.info("%s: level %d is not a tiled JPEG page; reading it on the CPU", st.slide_path, level)
            return None
        return cls(st, found, downsamples)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()

    def plan(self, x0_px: int, y0_px: int) -> RegionPlan:
        """The region plan of the tile at level-0 (x0_px, y0_px), as `read_region_um` makes it."""
        st = self.st
        return plan_region(
            x0_px, y0_px, size_um=st.tile_size_um, target_mpp=st.target_mpp, mpp=st.mpp,
            downsamples=self.downsamples,
        )  # fmt: skip

    def read(self, start: int, stop: int) -> RawBatch:
        """Tiles start..stop of the slide as compressed JPEG streams and their region plans."""
        st, lv = self.st, self.lv
        coords = np.asarray(st.coords_px[start:stop], np.int64)
        plans = _Plans.of([self.plan(int(x), int(y)) for x, y in coords])
        grid0, table, cells = _cell_table(plans.win, lv)
        streams, lengths = [], []
        for slot, (col, row) in enumerate(cells):
            stream = self._stream(int(col), int(row))
            if stream is None:  # a tile the file does not hold (sparse TIFF): background, like openslide
                table[table == slot] = -1
                stream = b""
            streams.append(stream)
            lengths.append(len(stream))
        data = np.frombuffer(b"".join(streams), np.uint8) if streams else np.zeros(0, np.uint8)
        return RawBatch(
            slide_path=st.slide_path, backend=st.backend, mpp=st.mpp, size_um=st.tile_size_um,
            target_mpp=st.target_mpp, tile_px=round(st.tile_size_um / st.target_mpp), coords_px=coords,
            level=lv.level, level_wh=(lv.width, lv.height), tile_wh=(lv.tile_w, lv.tile_h),
            data=torch.from_numpy(data.copy()), lengths=lengths, cells=cells, win=plans.win,
            box=plans.box, kind=plans.kind, factor=plans.factor, filt=plans.filt, grid0=grid0, table=table,
        )  # fmt: skip

    def _stream(self, col: int, row: int) -> bytes | None:
        """The complete JPEG stream of one tile; None: not in the file (white); b"": not a JPEG (bad)."""
        i = row * self.lv.n_cols + col
        offset, count = int(self.lv.offsets[i]), int(self.lv.counts[i])
        if count == 0 or offset == 0:
            return None
        if count <= 2:
            return b""
        tile = os.pread(self._fd, count, offset)
        if len(tile) != count or tile[:2] != SOI:
            return b""
        return complete_jpeg(tile, self.lv.tables, self.lv.rgb)


def _cell_table(win: np.ndarray, lv: JpegLevel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The JPEG grid cells each window touches (clipped to the level), deduplicated over the batch.

    Returns grid0 (B, 2) first cell (gx0, gy0) of each window, table (B, GH, GW) slot of each touched
    cell (-1: none) and cells (J, 2) (col, row) of each slot.
    """
    b = len(win)
    tw, th = lv.tile_w, lv.tile_h
    x0c, y0c = np.maximum(win[:, 0], 0), np.maximum(win[:, 1], 0)
    x1c = np.minimum(win[:, 0] + win[:, 2], lv.width)
    y1c = np.minimum(win[:, 1] + win[:, 3], lv.height)
    inside = (x1c > x0c) & (y1c > y0c)
    gx0, gy0 = x0c // tw, y0c // th
    gw = np.where(inside, (x1c - 1) // tw - gx0 + 1, 0)
    gh = np.where(inside, (y1c - 1) // th - gy0 + 1, 0)
    table = np.full((b, max(1, int(gh.max(initial=0))), max(1, int(gw.max(initial=0)))), -1, np.int64)
    slots: dict[tuple[int, int], int] = {}
    for j in range(b):
        for r in range(int(gh[j])):
            for c in range(int(gw[j])):
                cell = (int(gx0[j]) + c, int(gy0[j]) + r)
                table[j, r, c] = slots.setdefault(cell, len(slots))
    cells = np.array(list(slots) or np.zeros((0, 2)), np.int64).reshape(-1, 2)
    return np.stack([gx0, gy0], axis=1).astype(np.int64), table, cells

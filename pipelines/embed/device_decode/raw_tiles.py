"""Raw tile reading: the compressed JPEG tiles a batch of regions needs, sliced out of the TIFF.

Runs in the reader workers, which then decode nothing: per batch they ask `wsi.slides.region.plan_regions`
for the windows (the plans `Slide.read_region_um` follows, as arrays) and send the few kB of JPEG data
under them with the plans (`RawBatch`) to the main process; the bytes come from tile_bytes.py.
`RawSlideReader.open(st)` is None for a slide that is not a tiled 8-bit RGB JPEG TIFF (the CPU path).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wsi.pipelines.embed.batches import RawBatch, SlideTiles
from wsi.pipelines.embed.device_decode.tile_bytes import (
    MAX_GAP,
    cell_keys,
    read_streams,
    stream_header,
    table_of_keys,
)
from wsi.slides.jpeg_colour import Colour, colour_to_decode
from wsi.slides.region import RegionPlan, RegionPlans, plan_region, plan_regions
from wsi.slides.slide import open_slide
from wsi.slides.slide_colour import first_tile
from wsi.slides.tiff_header import is_tiff

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
                # decodes it (wsi.slides.slide_colour); an Aperio tile (no marker, 4:4:4) as the tag says
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


class RawSlideReader:
    """Slices the compressed JPEG tiles of the level `read_region_um` would use out of a TIFF slide."""

    def __init__(self, st: SlideTiles, level: JpegLevel, downsamples: tuple[float, ...]) -> None:
        self.st = st
        self.lv = level
        self.downsamples = downsamples
        self._fd = os.open(st.slide_path, os.O_RDONLY)
        self._scratch = memoryview(bytearray(MAX_GAP))  # gap bytes of coalesced reads, dropped; reused
        self._slide: _SlidePlans | None = None  # every tile's plan, made on the first read

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
            x0_px, y0_px, side_um=st.tile_um, target_mpp=st.target_mpp, mpp=st.mpp,
            downsamples=self.downsamples,
        )  # fmt: skip

    def plans(self, start: int, stop: int) -> RegionPlans:
        """The region plans of tiles start..stop, as arrays (row i = plan() of tile start + i)."""
        st = self.st
        coords = np.asarray(st.coords_px[start:stop], np.int64).reshape(-1, 2)
        return plan_regions(
            coords[:, 0], coords[:, 1], side_um=st.tile_um, target_mpp=st.target_mpp, mpp=st.mpp,
            downsamples=self.downsamples,
        )  # fmt: skip

    def read(self, start: int, stop: int) -> RawBatch:
        """Tiles start..stop of the slide as compressed JPEG streams and their region plans."""
        st, lv = self.st, self.lv
        if self._slide is None:  # the whole slide at once: a batch then only slices arrays
            self._slide = _SlidePlans.of(self.plans(0, st.n), lv)
        sp = self._slide
        gh, gw = sp.extent[start:stop].max(axis=0, initial=1).tolist()  # this batch's table: no wider
        table, cells, flat = table_of_keys(sp.keys[start:stop, :gh, :gw], lv.n_cols)
        streams = read_streams(
            self._fd, lv.offsets[flat], lv.counts[flat], stream_header(lv.tables, lv.rgb), lv.rgb,
            self._scratch,
        )  # fmt: skip
        if streams.missing.any():  # tiles the file does not hold (sparse TIFF): white, like openslide
            table[np.isin(table, np.flatnonzero(streams.missing))] = -1
        return RawBatch(
            slide_path=st.slide_path, backend=st.backend, mpp=st.mpp, side_um=st.tile_um,
            target_mpp=st.target_mpp, tile_px=sp.tile_px,
            coords_px=np.asarray(st.coords_px[start:stop], np.int64), level=lv.level,
            level_wh=(lv.width, lv.height), tile_wh=(lv.tile_w, lv.tile_h), data=streams.data,
            offsets=streams.offsets, lengths=streams.lengths, cells=cells, win=sp.win[start:stop],
            box=sp.box[start:stop], kind=sp.kind[start:stop], factor=sp.factor[start:stop],
            filt=sp.filt[start:stop], grid0=sp.grid0[start:stop], table=table,
        )  # fmt: skip


@dataclass(frozen=True)
class _SlidePlans:
    """Every tile's region plan and JPEG cells of one slide, as arrays (RawBatch's per-tile fields)."""

    tile_px: int
    win: np.ndarray  # (N, 4)
    box: np.ndarray  # (N, 3)
    kind: np.ndarray  # (N,)
    factor: np.ndarray  # (N,)
    filt: np.ndarray  # (N,)
    grid0: np.ndarray  # (N, 2) first JPEG cell of each window
    keys: np.ndarray  # (N, GH, GW) the cells each window touches (tile_bytes.cell_keys)
    extent: np.ndarray  # (N, 2) rows and columns of cells each window touches

    @classmethod
    def of(cls, plans: RegionPlans, lv: JpegLevel) -> _SlidePlans:
        grid0, keys = cell_keys(plans.win, lv)
        extent = np.stack([(keys >= 0).any(axis=2).sum(axis=1), (keys >= 0).any(axis=1).sum(axis=1)], 1)
        return cls(plans.tile_px, plans.win, plans.box(), plans.kind, plans.factor, plans.filters(), grid0,
                   keys, extent)  # fmt: skip

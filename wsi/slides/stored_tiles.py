"""A pyramid level's stored JPEG tiles, decoded directly: openslide's pixels without its painting.

openslide reads a region by decoding the JPEG tiles under it (libjpeg-turbo) and painting them with cairo
into premultiplied ARGB, which Slide then turns into RGB: on the 2-core test machine a 256 px region cost
2.7 ms that way, against 0.45 ms to decode its one JPEG tile, and a whole 2,220 x 2,967 px level 0.22 s
of CPU against 0.065 s. Where a level is one tiled TIFF page of 8-bit RGB or YCbCr JPEG tiles (Aperio
SVS and generic tiled TIFF, the formats whose levels openslide reads page by page), `JpegTiles.read`
decodes the stored tiles under a window with tifffile's decoder (imagecodecs' libjpeg-turbo, as
openslide's), keeps the last few decoded (neighbouring tiles of a grid share stored tiles) and copies the
window out. Same bytes as openslide's (tests/wsi/slides/test_stored_tiles.py compares whole levels of both
test slides), in a fifth of the time; a stored tile left empty (a sparse Aperio level) is white, as
openslide's transparent pixels are over glass.

A window that is exactly one whole stored tile (the tile stage's default grid at a level of 256 px
tiles) is decoded straight into the caller's array and not cached: no neighbour shares it, and the two
copies and the cache round trip cost ~10% of the tile stage's raw read (issue 35).

Public API:
  jpeg_levels(path) -> dict[(width, height), JpegTiles]   the file's tiled JPEG pages, by size; {} if none
  JpegTiles.read(x, y, w, h, out=None) -> (h, w, 3) uint8  a window in level px, inside the level; into
                                                           `out` when given (any (h, w, 3) uint8 view)
  JpegTiles.open()                                         open the file now (Slide does, at open time)
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.errors import SlideError

_JPEG = 7  # TIFF Compression: "new-style" JPEG (Aperio, libtiff, tifffile)
_RGB, _YCBCR = 2, 6  # TIFF PhotometricInterpretation
_JPEG_RGB = "RGB"  # libjpeg's JCS_RGB for imagecodecs.jpeg_decode (tifffile passes PHOTOMETRIC.RGB = 2)
_WHITE = 255
#: decoded tiles kept per slide (bytes): two rows of 256 px tiles across a 10 mm level at 1 um/px, and
#: openslide's own default tile cache size
CACHE_BYTES = 32 << 20


@dataclass
class JpegTiles:
    """One tiled JPEG page of a TIFF: where its tiles lie in the file and how to decode one."""

    path: Path
    width: int
    height: int
    tile_w: int
    tile_h: int
    offsets: np.ndarray  # (n_rows * n_cols,) int64, row-major
    counts: np.ndarray  # (n_rows * n_cols,) int64; 0: a tile the file leaves out
    tables: bytes | None  # JPEGTables of abbreviated tile streams
    #: tifffile's TiffPage.decode: (data, index, jpegtables=) -> (array (1, h, w, 3), indices, shape)
    decode: Callable[..., Any]
    #: the colour space the tiles' JPEG streams are taken to be in, as tifffile's decode takes it
    #: (`jpeg_colorspace`): "RGB" for Aperio's RGB-coded streams, None (libjpeg's guess) otherwise
    colorspace: str | None
    #: imagecodecs.jpeg_decode, the decoder under tifffile's (`_whole_tile` calls it with `out=`)
    jpeg_decode: Callable[..., Any]
    _cache: OrderedDict[int, np.ndarray] = field(default_factory=OrderedDict, repr=False)
    _cached_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _fd: int | None = None

    @property
    def n_cols(self) -> int:
        return -(-self.width // self.tile_w)

    def read(self, x: int, y: int, w: int, h: int, out: np.ndarray | None = None) -> np.ndarray:
        """(h, w, 3) uint8 of the window at level px (x, y), which lies inside the level; written into
        `out` (an (h, w, 3) uint8 array or view) and returned when given."""
        tw, th = self.tile_w, self.tile_h
        whole_tile = (w, h) == (tw, th) and x % tw == 0 and y % th == 0
        if whole_tile and x + w <= self.width and y + h <= self.height:
            return self._whole_tile((y // th) * self.n_cols + x // tw, out)
        if out is None:
            out = np.empty((h, w, 3), np.uint8)
        for row in range(y // th, (y + h - 1) // th + 1):
            for col in range(x // tw, (x + w - 1) // tw + 1):
                tx, ty = col * tw, row * th
                x0, y0, x1, y1 = max(x, tx), max(y, ty), min(x + w, tx + tw), min(y + h, ty + th)
                tile = self._tile(row * self.n_cols + col)
                target = out[y0 - y : y1 - y, x0 - x : x1 - x]
                if tile is None:
                    target[...] = _WHITE
                else:
                    target[...] = tile[y0 - ty : y1 - ty, x0 - tx : x1 - tx]
        return out

    def open(self) -> None:
        """Open the file now rather than at the first read: a file removed after this (a remote slide's
        copy that the local cache evicts) stays readable, as openslide's own handle does."""
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._cache.clear()
            self._cached_bytes = 0

    def _whole_tile(self, index: int, out: np.ndarray | None) -> np.ndarray:
        """Stored tile `index`, whole (it lies inside the level), decoded into `out` (a new array if None).

        Not cached: a window that is exactly one stored tile is what an aligned grid reads, and no other
        window of that grid touches the tile again, so caching would only cost the lock and evict the
        tiles that unaligned neighbours do share. A tile already cached (read by such a window) is
        copied from there."""
        with self._lock:
            hit = self._cache.get(index)
            if hit is not None:
                self._cache.move_to_end(index)
            elif self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY)
            fd = self._fd
        shape = (self.tile_h, self.tile_w, 3)
        if out is None:
            out = np.empty(shape, np.uint8)
        if hit is not None:
            out[...] = hit
            return out
        data = self._data(fd, index)
        if data is None:
            out[...] = _WHITE
            return out
        # imagecodecs decodes into C-contiguous arrays only: a view that is not (the part of a larger
        # window inside the level) gets a new array, copied over
        dest = out if out.flags.c_contiguous else np.empty(shape, np.uint8)
        # as tifffile's decode of a JPEG tile (TiffPage.decode -> decode_jpeg), given a destination: the
        # same decoder, tables and colour spaces; it raises when the stream's size is not the tile's
        self.jpeg_decode(
            data, tables=self.tables, colorspace=self.colorspace, outcolorspace=_JPEG_RGB, shape=shape[:2],
            out=dest,
        )  # fmt: skip
        if dest is not out:
            out[...] = dest
        return out

    def _data(self, fd: int | None, index: int) -> bytes | None:
        """The compressed bytes of stored tile `index`; None for a tile the file leaves out."""
        count = int(self.counts[index])
        if count == 0:
            return None
        assert fd is not None
        data = os.pread(fd, count, int(self.offsets[index]))  # thread-safe: no shared file position
        if len(data) != count:
            raise SlideError(f"{self.path}: stored tile {index} runs past the end of the file")
        return data

    def _tile(self, index: int) -> np.ndarray | None:
        with self._lock:
            hit = self._cache.get(index)
            if hit is not None:
                self._cache.move_to_end(index)
                return hit
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY)
            fd = self._fd
        data = self._data(fd, index)
        if data is None:
            return None
        tile = self.decode(data, index, jpegtables=self.tables)[0]
        tile = np.asarray(tile).reshape(tile.shape[-3:])  # (1, h, w, 3) -> (h, w, 3)
        with self._lock:
            if index not in self._cache:
                self._cache[index] = tile
                self._cached_bytes += tile.nbytes
                while self._cached_bytes > CACHE_BYTES and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._cached_bytes -= old.nbytes
        return tile


def jpeg_levels(path: Path) -> dict[tuple[int, int], JpegTiles]:
    """The tiled 8-bit 3-sample JPEG pages of a TIFF, by (width, height); a size that two pages share is
    left out (which one a backend calls the level is then unclear). Raises SlideError when the file's
    image data runs past its end (a truncated copy); {} for a file tifffile does not parse."""
    import imagecodecs
    import tifffile

    size = path.stat().st_size
    found: dict[tuple[int, int], JpegTiles | None] = {}
    try:
        with tifffile.TiffFile(path) as tif:
            end = 0
            for page in tif.pages:
                offsets, counts = page.dataoffsets, page.databytecounts
                if len(offsets):
                    end = max(end, max(o + c for o, c in zip(offsets, counts, strict=False)))
                if isinstance(page, tifffile.TiffPage) and _plain_jpeg(page):
                    key = (int(page.imagewidth), int(page.imagelength))
                    found[key] = None if key in found else _jpeg_tiles(path, page, imagecodecs.jpeg_decode)
    except Exception:  # a TIFF variant tifffile does not parse: the backend decides
        return {}
    if end > size:
        raise SlideError(
            f"{path}: the file is truncated ({size} bytes, but its image data runs to byte {end}); "
            "copy or download it again"
        )
    return {key: tiles for key, tiles in found.items() if tiles is not None}


def _plain_jpeg(page: Any) -> bool:
    return bool(
        page.is_tiled
        and int(page.compression) == _JPEG
        and int(page.photometric) in (_RGB, _YCBCR)
        and page.samplesperpixel == 3
        and page.bitspersample == 8
        and page.imagedepth == 1
        and int(page.planarconfig) == 1
        and len(page.dataoffsets) == len(page.databytecounts)
    )


def jpeg_colorspace(photometric: int, jfif: bool) -> str | None:
    """The colour space to decode a plain JPEG page's tiles from (`_plain_jpeg`: 3 samples, no extra
    samples, contiguous planes), as tifffile decides it (tifffile 2026.3.3 `jpeg_decode_colorspace`):
    RGB-tagged streams without a JFIF marker (Aperio) are RGB-coded, whatever libjpeg would guess from
    them; everything else is left to libjpeg (YCbCr). The output is RGB either way."""
    return _JPEG_RGB if photometric == _RGB and not jfif else None


def _jpeg_tiles(path: Path, page: Any, jpeg_decode: Callable[..., Any]) -> JpegTiles:
    return JpegTiles(
        path=path, width=int(page.imagewidth), height=int(page.imagelength), tile_w=int(page.tilewidth),
        tile_h=int(page.tilelength), offsets=np.asarray(page.dataoffsets, np.int64),
        counts=np.asarray(page.databytecounts, np.int64), tables=page.jpegtables, decode=page.decode,
        colorspace=jpeg_colorspace(int(page.photometric), bool(page.is_jfif)), jpeg_decode=jpeg_decode,
    )  # fmt: skip


__all__ = ["CACHE_BYTES", "JpegTiles", "jpeg_colorspace", "jpeg_levels"]

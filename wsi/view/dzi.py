"""DeepZoom over a slide: the `.dzi` descriptor and JPEG tiles that OpenSeadragon asks for.

openslide-python's `DeepZoomGenerator` does the tile arithmetic (levels, overlap, edge tiles) for any
object with OpenSlide's reading interface; tiffslide's `TiffSlide` has it, except that its
`read_region` returns RGB where the generator composites an RGBA image over the background, so the
tiffslide handle is wrapped to return RGBA. A slide whose JPEG tiles the backend decodes in the wrong
colour space (`wsi.slides.slide_colour`) is wrapped once more to convert them, as `Slide` does. One generator
per slide is made on first use and kept (`DeepZoomCache`); both backends read thread-safely (see
`wsi.slides.slide.open_slide`), so parallel tile requests share it. A plain image (PNG, JPEG) is shown from
its tiled pyramid in the cache (`wsi.slides.plain_images`), as the tile stage reads it.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
from PIL import Image

from wsi.core.errors import SlideError
from wsi.slides.plain_images import image_pyramid, is_image_slide, read_image_header
from wsi.slides.slide_colour import ColourFix, check_colours
from wsi.storage.slides import RangeFile, remote_slide
from wsi.storage.urls import is_url, parse_url

#: 254 + 2 x 1 overlap = 256 px tiles: the size the generator's docstring recommends for viewers
TILE_SIZE = 254
OVERLAP = 1
JPEG_QUALITY = 80


class _RgbaReads:
    """A tiffslide handle whose `read_region` returns RGBA, as DeepZoomGenerator composites it."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int]) -> Any:
        return self._handle.read_region(location, level, size).convert("RGBA")

    def __getattr__(self, name: str) -> Any:  # dimensions, levels, properties, best level, close
        return getattr(self._handle, name)


class _ColourFixedReads:
    """A handle whose RGBA `read_region` comes back in the colours its JPEG streams declare."""

    def __init__(self, reader: Any, fix: ColourFix) -> None:
        self._reader = reader
        self._fix = fix

    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int]) -> Any:
        rgba = np.asarray(self._reader.read_region(location, level, size).convert("RGBA"))
        return Image.fromarray(self._fix.apply_rgba(rgba, level), "RGBA")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


@dataclass
class DeepZoomSlide:
    """One open slide and its generator."""

    path: Path | str  # a local file, or a URL (wsi.storage.Url)
    handle: Any
    generator: Any
    hold: IO[str] | None = None  # a remote slide's local copy, held in the cache while the slide is open

    def dzi(self) -> str:
        return str(self.generator.get_dzi("jpeg"))

    def tile_jpeg(self, level: int, col: int, row: int) -> bytes:
        """The tile's JPEG bytes; ValueError for a level or address outside the pyramid."""
        if not 0 <= level < self.generator.level_count:
            raise ValueError(f"no DeepZoom level {level}")
        cols, rows = self.generator.level_tiles[level]
        if not (0 <= col < cols and 0 <= row < rows):
            raise ValueError(f"no tile {col}_{row} at level {level}")
        image = self.generator.get_tile(level, (col, row))
        buf = io.BytesIO()
        image.convert("RGB").save(buf, format="JPEG", quality=JPEG_QUALITY)
        return buf.getvalue()

    def close(self) -> None:
        self.handle.close()
        if self.hold is not None:
            self.hold.close()


def open_deepzoom(path: Path | str, backend: str) -> DeepZoomSlide:
    """Open `path` with `backend` ("openslide" | "tiffslide") for DeepZoom; SlideError when unreadable.
    A URL is read by ranges (tiffslide) or from its local copy (openslide; `wsi.storage.slides`)."""
    from openslide.deepzoom import DeepZoomGenerator

    file, hold = (
        remote_slide(parse_url(str(path), what="slide"), backend) if is_url(path) else (Path(path), None)
    )
    if isinstance(file, Path) and is_image_slide(file):  # its pyramid (a remote image's: from the copy)
        copy = hold
        try:
            file, hold = image_pyramid(file, read_image_header(file, name=path), name=path)
        finally:
            if copy is not None:
                copy.close()
    try:
        if backend == "openslide":
            import openslide

            handle: Any = openslide.OpenSlide(cast(Path, file))  # remote_slide gives openslide a copy
            reader: Any = handle
        else:
            import tiffslide

            source: Any = file.open() if isinstance(file, RangeFile) else file
            handle = tiffslide.TiffSlide(source)
            reader = _RgbaReads(handle)
        vendor = str(handle.properties.get(f"{backend}.vendor") or "generic")
        fix = check_colours(file, backend, vendor, tuple(handle.level_dimensions))
        if fix:
            reader = _ColourFixedReads(reader, fix)
        generator = DeepZoomGenerator(reader, tile_size=TILE_SIZE, overlap=OVERLAP, limit_bounds=False)
    except SlideError:  # wrong colours that cannot be corrected: the message says what to do
        handle.close()
        if hold is not None:
            hold.close()
        raise
    except Exception as exc:  # each backend raises its own types; the page shows file + reason
        if hold is not None:
            hold.close()
        raise SlideError(
            f"{path}: {backend} cannot open it for viewing ({type(exc).__name__}: {exc})"
        ) from exc
    return DeepZoomSlide(path=path, handle=handle, generator=generator, hold=hold)


class DeepZoomCache:
    """At most `max_open` slides open at once (least recently used closed first); thread-safe.

    A slide is opened under a per-slide lock, so many first requests for one slide open it once, and
    requests for other slides are not held up meanwhile.
    """

    def __init__(self, backend: str, max_open: int = 32) -> None:
        self.backend = backend
        self.max_open = max_open
        self._open: OrderedDict[Path | str, DeepZoomSlide] = OrderedDict()
        self._lock = threading.Lock()
        self._opening: dict[Path | str, threading.Lock] = {}

    def get(self, path: Path | str) -> DeepZoomSlide:
        """The open slide of a local path or a URL (wsi.storage.Url, a str)."""
        with self._lock:
            slide = self._open.get(path)
            if slide is not None:
                self._open.move_to_end(path)
                return slide
            gate = self._opening.setdefault(path, threading.Lock())
        with gate:
            with self._lock:
                slide = self._open.get(path)
            if slide is not None:
                return slide
            slide = open_deepzoom(path, self.backend)
            with self._lock:
                self._open[path] = slide
                while len(self._open) > self.max_open:
                    # a request still reading the evicted slide keeps its object alive; the handle is
                    # closed only when nothing refers to it, by the backend's own finaliser
                    self._open.popitem(last=False)
        return slide

    def close(self) -> None:
        with self._lock:
            for slide in self._open.values():
                slide.close()
            self._open.clear()


__all__ = ["OVERLAP", "TILE_SIZE", "DeepZoomCache", "DeepZoomSlide", "open_deepzoom"]

"""A plain image's tiled pyramid, made once in the local cache and then read like any generic tiled TIFF.

PNG and JPEG cannot be read in windows: their pixels come out in order, top row first, so a tile at the
bottom of a 40,000 px square JPEG costs decoding all 4.8 GB above it. libvips (pyvips, its binary wheel)
streams the image instead, a band of rows at a time, into a tiled, lossless (deflate) pyramidal BigTIFF:
memory grows with the image's width, not its area, and every later read (the tissue thumbnail from a
coarse level, each tile, the embed stage, `wsi view`) is a window of a tiled file (docs/benchmarks.md,
"Plain images as slides", measures peak memory and time against decoding whole). A format that can only
be decoded whole (an interlaced PNG, a progressive JPEG) is refused above MAX_WHOLE_DECODE_PX, naming
the memory it would take. Alpha is composited over white glass, grey and 16-bit images become 8-bit RGB;
colour profiles and EXIF orientation are not applied (the pixels as stored).

Cache: `<WSI_CACHE_DIR>/pyramids/<sha of the image's path, size, mtime, header>/pyramid.tif` with
`entry.json`. An entry is made under an exclusive lock (two processes opening one image wait for one
conversion), written to a temporary name and renamed, and held by a shared lock while a slide reads it;
when the pyramids pass WSI_CACHE_GB the least recently used go first, never one being made or read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import IO

from wsi.core.errors import SlideError
from wsi.core.files import temp_sibling, write_text_atomic
from wsi.core.work_bounds import MAX_WHOLE_DECODE_PX
from wsi.slides.plain_images.header import ImageHeader
from wsi.storage.entry_locks import ENTRY, entry_locked, entry_unheld, hold_entry, read_entry
from wsi.storage.identity import fingerprint
from wsi.storage.settings import StorageSettings, storage_settings

log = logging.getLogger(__name__)

#: bump when the pyramid's content changes (tile size, compression, colour handling): old entries unused
PYRAMID_VERSION = 1
TILE_PX = 256
_PYRAMID = "pyramid.tif"


def pyramid_dir(path: Path, settings: StorageSettings) -> Path:
    """The cache entry of the image at `path` as it is now: another size, mtime or header (its first
    bytes, `wsi.storage.identity`: an image copied over another of the same size with its mtime kept) is
    another entry, so a replaced image is never read from the old one's pyramid."""
    found = fingerprint(path)
    key = f"{path.absolute()}|{found.size}|{found.version}|{found.header_sha256}|{PYRAMID_VERSION}"
    return settings.root / "pyramids" / hashlib.sha256(key.encode()).hexdigest()[:24]


def image_pyramid(
    path: Path,
    header: ImageHeader,
    *,
    name: object = None,
    settings: StorageSettings | None = None,
    max_whole_px: int = MAX_WHOLE_DECODE_PX,
) -> tuple[Path, IO[str]]:
    """The tiled pyramid of the image at `path` (made now, or found made), and a shared hold on it: close
    the returned file when the pyramid is no longer read. SlideError naming `name` (default `path`)
    when the image cannot be decoded, or only whole and it is larger than `max_whole_px`."""
    name = path if name is None else name
    settings = settings or storage_settings()
    where = pyramid_dir(path, settings)
    pyramid = where / _PYRAMID
    with entry_locked(where):
        if not (pyramid.is_file() and read_entry(where).get("version") == PYRAMID_VERSION):
            check_decodable(header, name, max_whole_px)
            seconds = _convert(path, pyramid, name)
            write_text_atomic(where / ENTRY, json.dumps({
                "source": str(path.absolute()), "format": header.format, "width": header.width,
                "height": header.height, "version": PYRAMID_VERSION, "bytes": pyramid.stat().st_size,
                "seconds": round(seconds, 3),
            }))  # fmt: skip
            log.info(
                "%s: %s image of %d x %d px made into a tiled pyramid in the cache (%.1f s, %.0f MB): %s",
                name, header.format, header.width, header.height, seconds, pyramid.stat().st_size / 1e6,
                pyramid,
            )  # fmt: skip
        else:
            with contextlib.suppress(OSError):
                os.utime(where / ENTRY)  # recently used
        hold = hold_entry(where)  # before the entry lock goes: never evicted between the check and the read
    _make_room(settings, keep=where)
    return pyramid, hold


def check_decodable(header: ImageHeader, name: object, max_whole_px: int = MAX_WHOLE_DECODE_PX) -> None:
    """SlideError when the decoder would hold more than `max_whole_px` pixels at once."""
    if header.whole_px <= max_whole_px:
        return
    gb = header.whole_px * 3 / 1e9
    raise SlideError(
        f"{name}: {header.whole_why or 'this image'} of {header.width} x {header.height} px can only be "
        f"decoded whole (about {gb:.3g} GB of memory), more than the limit of {max_whole_px / 1e6:.0f} "
        "megapixels; save it as a baseline (not progressive) JPEG, a non-interlaced PNG or a tiled TIFF on "
        "a machine with that memory (e.g. `vips tiffsave IMAGE out.tif --tile --pyramid --compression "
        "deflate --bigtiff`) and give that file"
    )


def _convert(path: Path, out: Path, name: object) -> float:
    """Stream the image into a tiled pyramidal TIFF at `out` (written under a temporary name); seconds."""
    import pyvips

    start = time.perf_counter()
    tmp = temp_sibling(out)
    try:
        # sequential: libvips decodes top to bottom once, keeping only the rows the pyramid still needs;
        # fail_on="truncated": a cut-off file is an error, not an image padded with grey
        image = pyvips.Image.new_from_file(str(path), access="sequential", fail_on="truncated")
        if image.hasalpha():  # transparent = no tissue: white glass, as openslide's RGBA is read
            image = image.flatten(background=[65535 if image.format == "ushort" else 255] * (image.bands - 1))
        image = image.colourspace("srgb")  # grey, 16-bit, CMYK -> 8-bit sRGB
        if image.bands > 3:
            image = image.extract_band(0, n=3)
        if image.format != "uchar":
            image = image.cast("uchar")
        image.tiffsave(
            str(tmp), tile=True, tile_width=TILE_PX, tile_height=TILE_PX, pyramid=True, bigtiff=True,
            compression="deflate", level=1,
        )  # fmt: skip
        os.replace(tmp, out)
    except pyvips.Error as exc:
        detail = " ".join(str(exc).split())
        raise SlideError(f"{name}: cannot decode the image ({detail[:300]}); is the file complete?") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------ the cache


def _make_room(settings: StorageSettings, *, keep: Path) -> None:
    """Remove the least recently used pyramids until all of them fit under WSI_CACHE_GB; entries being
    made or read stay."""
    limit = int(settings.cache_gb * 1e9)
    entries = []
    for folder in keep.parent.iterdir():
        pyramid = folder / _PYRAMID
        with contextlib.suppress(OSError):
            entries.append(((folder / ENTRY).stat().st_mtime, pyramid.stat().st_size, folder))
    total = sum(size for _, size, _ in entries)
    for _, size, folder in sorted(entries):
        if total <= limit:
            break
        if folder == keep:
            continue
        with entry_locked(folder, wait=False) as mine, entry_unheld(folder) as free:
            if not (mine and free):
                continue
            (folder / _PYRAMID).unlink(missing_ok=True)
            (folder / ENTRY).unlink(missing_ok=True)
        total -= size
        log.info("removed the pyramid %s from the cache (%.0f MB; WSI_CACHE_GB)", folder, size / 1e6)


__all__ = ["PYRAMID_VERSION", "TILE_PX", "check_decodable", "image_pyramid", "pyramid_dir"]

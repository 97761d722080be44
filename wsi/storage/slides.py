"""Remote slides: read in place with range reads (tiffslide), or copied to the local cache first.

tiffslide reads a TIFF through any file object, so `--backend tiffslide` opens a remote slide over
fsspec: only the bytes of the IFDs and of the tiles a read touches are fetched, in blocks of
`WSI_BLOCK_MB`, of which the last `WSI_CACHE_BLOCKS` stay in memory per open handle (fsspec's
"blockcache", least recently used first): memory per open slide is bounded, and neighbouring tiles,
stored next to each other in the file, come from one request. openslide (the default backend) takes a
local file name only, and so do DICOM series (one slide is a folder of files), MIRAX (an index beside a
folder of data files) and VMS; those are copied to the local cache (`wsi.storage.cache`) first, which the
log says with the size and the reason.

    remote_slide(url, backend) -> (RangeFile | Path, hold)  what `wsi.slides.slide.open_slide` reads
    RangeFile(url, size, version).open()                 a fresh read handle with its own block cache
    open_binary(source)                                  a binary handle on a Path or a RangeFile
    check_complete(source, size, url)                    SlideError if the TIFF's data runs past its end
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO, cast

from wsi.core.errors import SlideError
from wsi.core.suffixes import IMAGE_SLIDE_SUFFIXES
from wsi.storage.cache import held_local_copies
from wsi.storage.fs import filesystem, list_files, remote_info, translated
from wsi.storage.settings import storage_settings
from wsi.storage.urls import Url

log = logging.getLogger(__name__)

#: formats kept as several files: copied as a group (the slide file's folder, or its data folder)
_MULTI_FILE = (".dcm", ".mrxs", ".vms", ".vmu")


@dataclass(eq=False)
class RangeFile:
    """A remote file read by byte ranges. Each `open()` is a handle with its own bounded block cache;
    `bytes_fetched` counts what all of them fetched (for benchmarks and logs)."""

    url: Url
    size: int
    version: str
    block_bytes: int
    blocks: int
    _fetched: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def open(self, mode: str = "rb", *, block_bytes: int | None = None) -> BinaryIO:
        """A read handle; `block_bytes` smaller than the setting suits a look at the file's headers."""
        if mode != "rb":
            raise ValueError("a remote slide is read only")
        fs, path = filesystem(self.url)
        with translated(self.url, "opening the slide"):
            fh = fs.open(
                path, "rb", block_size=block_bytes or self.block_bytes, cache_type="blockcache",
                cache_options={"maxblocks": self.blocks}, size=self.size,
            )  # fmt: skip
        fetch = fh.cache.fetcher  # the block cache's one way to the storage: counted on its way

        def counted(start: int, end: int) -> bytes:
            data: bytes = fetch(start, end)
            with self._lock:
                self._fetched += len(data)
            return data

        fh.cache.fetcher = counted
        return cast(BinaryIO, fh)

    @property
    def bytes_fetched(self) -> int:
        """Bytes fetched from the storage by every handle opened so far."""
        with self._lock:
            return self._fetched

    def __str__(self) -> str:
        return str(self.url)


def remote_slide(url: Url, backend: str) -> tuple[RangeFile | Path, IO[str] | None]:
    """How to read the remote slide `url` with `backend`: a RangeFile (tiffslide, a single-file format) or
    the path of a local copy (openslide, and formats made of several files), with the copy's hold in the
    cache (close it when the slide is closed; None for a RangeFile)."""
    suffix = url.suffix.lower()
    if backend == "tiffslide" and suffix not in _MULTI_FILE + IMAGE_SLIDE_SUFFIXES:
        settings = storage_settings()
        fs, path = filesystem(url)
        with translated(url, "opening the slide"):
            info = remote_info(fs, path)
        return RangeFile(url, info.size, info.version, settings.block_bytes, settings.blocks), None
    folder = url.parent
    if suffix == ".dcm":  # a DICOM series: every instance in the folder (openslide finds them there)
        why = "a DICOM series is read from local files (openslide)"
        names = sorted(rel for rel in list_files(folder, doing="listing the DICOM series") if "/" not in rel)
        rels = [url.name, *(n for n in names if n.lower().endswith(".dcm") and n != url.name)]
    elif suffix == ".mrxs":  # the index and its data folder of the same name
        why = "MIRAX (an index and its data folder) is read from local files (openslide)"
        inside = list_files(folder / url.stem, doing="listing the MIRAX data folder")
        rels = [url.name, *(f"{url.stem}/{rel}" for rel in sorted(inside))]
    elif suffix in (".vms", ".vmu"):  # the index and the image files named after it
        why = "Hamamatsu VMS/VMU (an index beside image files) is read from local files (openslide)"
        names = sorted(rel for rel in list_files(folder, doing="listing the VMS files") if "/" not in rel)
        rels = [url.name, *(n for n in names if n.startswith(url.stem) and n != url.name)]
    elif suffix in IMAGE_SLIDE_SUFFIXES:
        why = "a plain image is made into a tiled pyramid from a local copy (wsi.slides.plain_images)"
        rels = [url.name]
    else:
        why = "openslide reads local files only; --backend tiffslide reads TIFF-based slides in place"
        rels = [url.name]
    paths, hold = held_local_copies(folder, rels, why=why)
    return paths[0], hold


#: block size of a look at a remote file's headers (TIFF IFDs, the first tile of a level)
PROBE_BYTES = 1 << 16


def open_binary(source: Path | RangeFile) -> BinaryIO:
    """A binary read handle on a local file or a remote one (tifffile takes either); a remote one reads
    in small blocks, since it serves a look at headers."""
    return source.open("rb", block_bytes=PROBE_BYTES) if isinstance(source, RangeFile) else open(source, "rb")


def check_complete(source: Path | RangeFile, size: int, url: Url) -> None:
    """A remote TIFF (read by ranges, or its local copy) whose IFDs or tile data run past the end of the
    file is truncated: say so at open time, naming the URL. (A local slide's check is
    `wsi.slides.stored_tiles.jpeg_levels`, which parses the file once for both.)"""
    import tifffile

    try:
        with open_binary(source) as fh, tifffile.TiffFile(fh) as tif:
            end = 0
            for page in tif.pages:
                offsets, counts = page.dataoffsets, page.databytecounts
                if len(offsets):
                    end = max(end, max(o + c for o, c in zip(offsets, counts, strict=False)))
    except Exception:  # a TIFF variant tifffile does not parse: let the backend decide
        log.debug("%s: tifffile could not check the TIFF structure", url, exc_info=True)
        return
    if end > size:
        raise SlideError(
            f"{url}: the file is truncated ({size} bytes, but its image data runs to byte {end}); "
            "copy or upload it again"
        )


__all__ = ["RangeFile", "check_complete", "open_binary", "remote_slide"]

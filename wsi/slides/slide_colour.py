"""Slides whose JPEG tiles contradict the container's colour space, and the exact fix of what a reader
returns for them.

A converter may write JFIF (YCbCr, 4:2:0) frames into a DICOM series whose header says
`PhotometricInterpretation = RGB`, or YCbCr tiles into a TIFF whose Photometric tag says RGB. openslide
4.0.1 decodes DICOM and tiled-TIFF JPEG with the container's colour space (src/openslide-vendor-dicom.c
and src/openslide-decode-tiff.c `decode_jpeg`, commit e8dccf0d), so it hands back the upsampled Y'CbCr
samples as RGB: tissue turns salmon and green and every tile looks like ink. tiffslide (tifffile
2026.3.3 `jpeg_decode_colorspace`) follows a JFIF marker but forces RGB on any other stream of an RGB
TIFF. pydicom 3 follows the stream (`_conform_jpg_colorspace`); wsidicom did until 0.35.0, whose
decoders now keep RGB-labelled frames untransformed unless the stream signals RGB itself (commit
8574273, wsidicom/codec/decoder.py `_should_suppress_color_transform`), i.e. as openslide does.

Which levels: openslide sorts a DICOM series' VOLUME instances by width into levels, finding the series'
other files in the same folder (openslide-vendor-dicom.c); a level here is the instance whose
TotalPixelMatrixColumns x Rows equal the level's size, a TIFF level the tiled page of that size.

`check_colours` finds out once per slide: it reads the first JPEG tile of every pyramid level (the
TIFF page, or the first frame of the level's DICOM instance, read with pydicom up to the pixel data and
then one fragment), asks the stream what it holds (`wsi.slides.jpeg_colour.stream_colour`) and the backend
what it will decode it as. When the backend would return Y'CbCr as RGB, `ColourFix.apply` converts the
pixels with libjpeg-turbo's own integer arithmetic, so they equal a decode that followed the stream, bit
for bit wherever the backend does not resample (openslide shifts a level with a fractional downsample
by part of a pixel, interpolating the raw Y'CbCr first: equal up to rounding where the conversion clips).
It costs a per-pixel table lookup, 10-30% of a read, only on those slides (benchmarks/dicom_colour.py).
The opposite case (RGB samples the backend converts as YCbCr, clipping them) cannot be undone from the
pixels, and raises SlideError saying what to do.

Public API:
  ColourFix(levels, note)                    .apply(rgb, level), .apply_rgba(rgba, level), bool(fix)
  check_colours(path, backend, vendor, level_dimensions) -> ColourFix   cached per file; logs once
  first_tile(filehandle, page) -> bytes      a tifffile page's first stored tile (its JPEG header)
"""

from __future__ import annotations

import functools
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.errors import SlideError
from wsi.slides.jpeg_colour import (
    Colour,
    JpegHeader,
    libjpeg_colour,
    parse_header,
    stream_colour,
    ycbcr_to_rgb,
)
from wsi.storage.slides import RangeFile, open_binary

log = logging.getLogger(__name__)

_WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"
_JPEG_BASELINE = "1.2.840.10008.1.2.4.50"  # the one JPEG transfer syntax openslide decodes
_TIFF_JPEG = 7
_PIXEL_DATA = (0x7FE0, 0x0010)
_ITEM = (0xFFFE, 0xE000)
#: bytes of a frame or tile read to find its header (SOF follows the tables and any APPn segments)
_HEAD_BYTES = 1 << 18
_Dims = tuple[tuple[int, int], ...]
#: openslide vendors whose TIFF JPEG tiles go through `_openslide_tiff_read_tile` (openslide-decode-tiff.c)
_OPENSLIDE_TIFF_VENDORS = frozenset(
    {"aperio", "argos", "generic-tiff", "huron", "leica", "philips", "trestle", "ventana"}
)


@dataclass(frozen=True)
class LevelColour:
    """One pyramid level whose stream and container disagree."""

    level: int
    stream: Colour  # what the JPEG stream says it holds
    decoded_as: Colour  # what the backend decodes it as
    why: str  # the stream's evidence and the container's claim, for the log


@dataclass(frozen=True)
class ColourFix:
    """The levels whose pixels the backend returns as raw Y'CbCr; empty for almost every slide."""

    levels: frozenset[int] = frozenset()
    note: str = ""  # what was found and done (the log line, after the slide's path; `wsi info`)

    def __bool__(self) -> bool:
        return bool(self.levels)

    def apply(self, rgb: np.ndarray, level: int) -> np.ndarray:
        """(h, w, 3) uint8 pixels read from `level`, converted when that level needs it."""
        return ycbcr_to_rgb(rgb) if level in self.levels else rgb

    def apply_rgba(self, rgba: np.ndarray, level: int) -> np.ndarray:
        """openslide's (h, w, 4) RGBA with its colour converted; alpha (no data) kept."""
        if level not in self.levels:
            return rgba
        out = np.array(rgba, copy=True)
        out[..., :3] = ycbcr_to_rgb(rgba[..., :3])
        return out


NO_FIX = ColourFix()


def check_colours(
    path: str | os.PathLike[str] | RangeFile, backend: str, vendor: str, level_dimensions: _Dims
) -> ColourFix:
    """What the backend's pixels of this slide need; one log line (WARNING) per file and process.

    `path` may be a remote file read by ranges (`wsi.storage.slides.RangeFile`, cached by its version).
    Raises SlideError when the backend converts RGB samples as YCbCr (not correctable from its output).
    """
    if isinstance(path, RangeFile):
        return _check(_Remote(path), backend, vendor, tuple(level_dimensions), 0, path.size)
    stat = Path(path).stat()
    return _check(str(path), backend, vendor, tuple(level_dimensions), stat.st_mtime_ns, stat.st_size)


class _Remote:
    """A remote file as a cache key: equal while its URL and version are (the handle is not the key)."""

    def __init__(self, file: RangeFile) -> None:
        self.file = file
        self.key = (str(file.url), file.version)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Remote) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __str__(self) -> str:
        return str(self.file.url)


@functools.lru_cache(maxsize=64)
def _check(
    source: str | _Remote, backend: str, vendor: str, dims: _Dims, _mtime: int, _size: int
) -> ColourFix:
    path: Path | RangeFile = source.file if isinstance(source, _Remote) else Path(source)
    try:
        if backend == "openslide" and vendor == "dicom" and isinstance(path, Path):
            found = _dicom_levels(path, dims)
            container = "PhotometricInterpretation"
        elif (backend == "tiffslide" or vendor in _OPENSLIDE_TIFF_VENDORS) and _is_tiff(path):
            found = _tiff_levels(path, backend, dims)
            container = "TIFF Photometric tag"
        else:
            return NO_FIX
    except Exception:  # a damaged file: the backend's own reads say what is wrong with it
        log.debug("%s: the JPEG colour check could not read the file", path, exc_info=True)
        return NO_FIX
    if not found:
        return NO_FIX
    wrong = [f for f in found if f.stream == "rgb"]
    if wrong:
        hint = (
            "read it with --backend tiffslide, which follows the stream"
            if container.startswith("TIFF")
            else "set PhotometricInterpretation to RGB in its instances (pydicom: "
            "ds.PhotometricInterpretation = 'RGB'; ds.save_as(path)), which openslide then follows"
        )
        raise SlideError(
            f"{path}: level {wrong[0].level}'s JPEG tiles hold RGB ({wrong[0].why}) but {backend} decodes "
            f"them as YCbCr, as the {container} says; the colours would be wrong and cannot be "
            f"corrected afterwards: {hint}"
        )
    levels = frozenset(f.level for f in found)
    first = found[0]
    which = ", ".join(map(str, sorted(levels)))
    note = (
        f"its JPEG tiles are YCbCr ({first.why}) but {backend} decodes them as RGB; converting them as the "
        f"stream says (level{'s' if len(levels) > 1 else ''} {which})"
    )
    log.warning("%s: %s", path, note)
    return ColourFix(levels, note)


def _is_tiff(path: Path | RangeFile) -> bool:
    with open_binary(path) as fh:
        return fh.read(4) in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


# ------------------------------------------------------------------------------------------------ TIFF
def _tiff_levels(path: Path | RangeFile, backend: str, dims: _Dims) -> list[LevelColour]:
    """Levels of a tiled JPEG TIFF whose tiles the backend decodes in the wrong colour space."""
    import tifffile

    out = []
    with open_binary(path) as fh, tifffile.TiffFile(fh) as tif:
        pages = {
            (int(p.imagewidth), int(p.imagelength)): p
            for p in reversed(tif.pages)  # the first page of a size wins
            if isinstance(p, tifffile.TiffPage) and p.is_tiled
        }
        for level, wh in enumerate(dims):
            page = pages.get((int(wh[0]), int(wh[1])))
            if page is None or not _direct_jpeg(page):
                continue
            header = parse_header(first_tile(tif.filehandle, page))
            if header is None:
                continue
            stream, why = stream_colour(header)
            decoded = _tiff_decoded_as(backend, int(page.photometric), header)
            if stream is not None and decoded is not None and stream != decoded:
                photometric = "RGB" if int(page.photometric) == 2 else "YCbCr"
                out.append(LevelColour(level, stream, decoded, f"{why}; TIFF Photometric {photometric}"))
    return out


def _direct_jpeg(page: Any) -> bool:
    """openslide's direct JPEG path (openslide-decode-tiff.c `read_direct`): tiled 8-bit 3-sample JPEG."""
    return (
        int(page.compression) == _TIFF_JPEG
        and int(page.planarconfig) == 1
        and int(page.photometric) in (2, 6)
        and page.bitspersample == 8
        and page.samplesperpixel == 3
        and not page.extrasamples
    )


def first_tile(fh: Any, page: Any) -> bytes:
    """The start of a tifffile page's first stored tile (enough for its JPEG header); b"" if none."""
    for offset, count in zip(page.dataoffsets, page.databytecounts, strict=False):
        if offset and count:
            fh.seek(offset)
            return bytes(fh.read(min(int(count), _HEAD_BYTES)))
    return b""


def _tiff_decoded_as(backend: str, photometric: int, header: JpegHeader) -> Colour | None:
    """What the backend decodes a tile of this page as. openslide: the Photometric tag (JCS_RGB for 2,
    JCS_YCbCr for 6). tiffslide: tifffile's `jpeg_decode_colorspace` forces RGB on an RGB page unless its
    first tile has a JFIF marker, and otherwise leaves libjpeg-turbo to decide from the stream."""
    if backend == "openslide":
        return "rgb" if photometric == 2 else "ycbcr"
    if photometric == 2 and not header.jfif:
        return "rgb"
    return libjpeg_colour(header)


# ----------------------------------------------------------------------------------------------- DICOM
def _dicom_levels(path: Path, dims: _Dims) -> list[LevelColour]:
    """Levels of an openslide DICOM series whose frames contradict their PhotometricInterpretation."""
    try:
        import pydicom  # noqa: F401
    except ImportError:
        log.warning(
            "%s: pydicom is not installed, so the colour space of its JPEG frames is not checked against "
            "its header (a mislabelled series would read in the wrong colours): pip install 'wsi[images]'",
            path,
        )
        return []
    own = _dicom_head(path)
    if own is None:
        return []
    instances = [own]
    for other in sorted(path.parent.iterdir()):  # openslide finds the series' files the same way
        if other != path and other.is_file() and _has_dicom_magic(other):
            head = _dicom_head(other)
            if head is not None and head.series_uid == own.series_uid:
                instances.append(head)
    out = []
    for level, wh in enumerate(dims):
        matching = [i for i in instances if (i.columns, i.rows) == tuple(wh) and i.syntax == _JPEG_BASELINE]
        if not matching:
            continue
        inst = min(matching, key=lambda i: (not i.volume, str(i.path)))
        header = parse_header(_first_frame(inst.path))
        if header is None:
            continue
        stream, why = stream_colour(header)
        decoded: Colour = "ycbcr" if inst.photometric == "YBR_FULL_422" else "rgb"
        if stream is not None and stream != decoded:
            claim = f"{why}; PhotometricInterpretation {inst.photometric}"
            out.append(LevelColour(level, stream, decoded, claim))
    return out


@dataclass(frozen=True)
class _Instance:
    path: Path
    series_uid: str
    columns: int  # TotalPixelMatrixColumns
    rows: int
    photometric: str
    syntax: str  # transfer syntax UID
    volume: bool  # ImageType[2] == VOLUME


def _has_dicom_magic(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(128)
        return fh.read(4) == b"DICM"


def _dicom_head(path: Path) -> _Instance | None:
    import pydicom

    try:
        ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=[
            "SOPClassUID", "SeriesInstanceUID", "ImageType", "TotalPixelMatrixColumns",
            "TotalPixelMatrixRows", "PhotometricInterpretation",
        ])  # fmt: skip
    except Exception:  # a damaged or foreign file: openslide skips it too
        log.debug("%s: not read as DICOM", path, exc_info=True)
        return None
    if str(ds.get("SOPClassUID", "")) != _WSI_SOP_CLASS:
        return None
    image_type = list(ds.get("ImageType", []) or [])
    return _Instance(
        path, str(ds.get("SeriesInstanceUID", "")), int(ds.get("TotalPixelMatrixColumns", 0) or 0),
        int(ds.get("TotalPixelMatrixRows", 0) or 0), str(ds.get("PhotometricInterpretation", "")),
        str(ds.file_meta.get("TransferSyntaxUID", "")),
        len(image_type) < 3 or str(image_type[2]).upper() == "VOLUME",
    )  # fmt: skip


def _first_frame(path: Path) -> bytes:
    """The start of the first frame's JPEG stream: the first fragment after the Basic Offset Table of the
    encapsulated Pixel Data (DICOM PS3.5 A.4), read without loading the rest; b"" when absent."""
    import pydicom

    with open(path, "rb") as fh:
        pydicom.dcmread(fh, stop_before_pixels=True, specific_tags=["SOPClassUID"])  # leaves fh at the tag
        head = fh.read(12)  # explicit VR little endian: tag, "OB", 2 reserved, 4-byte undefined length
        if len(head) < 12 or struct.unpack("<HH", head[:4]) != _PIXEL_DATA:
            return b""
        bot = _item_length(fh.read(8))  # the Basic Offset Table item (may be empty)
        if bot is None:
            return b""
        fh.seek(bot, 1)
        first = _item_length(fh.read(8))  # the first fragment: the first frame's start
        return b"" if first is None else bytes(fh.read(min(first, _HEAD_BYTES)))


def _item_length(item: bytes) -> int | None:
    """The length of an encapsulated-data item from its 8-byte header; None when it is not an item."""
    if len(item) < 8 or struct.unpack("<HH", item[:4]) != _ITEM:
        return None
    return int(struct.unpack("<I", item[4:])[0])


__all__ = ["NO_FIX", "ColourFix", "check_colours", "first_tile"]

"""What a plain image's header says, read without decoding a pixel: its format and size, its resolution
and whether that can be trusted, and how many pixels a decoder must hold at once.

Resolution, by format (the first that gives a physical unit is used):
- PNG: the pHYs chunk in pixels per metre (unit 0 gives an aspect ratio only, no size).
- JPEG: the JFIF density in dots per inch or per centimetre (unit 0: an aspect ratio only); else the
  EXIF XResolution with its ResolutionUnit (inch or centimetre).
- TIFF: the first page's XResolution with its ResolutionUnit (inch or centimetre).
A value is trusted only inside `wsi.slides.tiff_header.PLAUSIBLE_MPP` (0.01-50 um/px). The densities image
software writes when it knows nothing of the scale (72 or 96 dpi: 353 and 265 um/px; a camera's EXIF
72-350 dpi) all lie outside it: such an image needs --mpp, and `ignored` says what was found and why it
was not used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wsi.core.errors import SlideError
from wsi.slides.tiff_header import PLAUSIBLE_MPP, tiff_resolution_um

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_MAGIC = b"\xff\xd8\xff"
_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
#: micrometres per unit of a resolution: JFIF 1 = inch, 2 = cm; EXIF/TIFF 2 = inch, 3 = cm
_JFIF_UNIT_UM = {1: 25400.0, 2: 10000.0}
_EXIF_UNIT_UM = {2: 25400.0, 3: 10000.0}
_EXIF_XRES, _EXIF_UNIT = 0x011A, 0x0128
#: rows libjpeg decodes at once (one MCU row at 2x vertical chroma subsampling)
_JPEG_ROWS = 16


@dataclass(frozen=True)
class ImageHeader:
    """A plain image as its header describes it."""

    format: str  # "PNG", "JPEG" or "TIFF" (from the file's first bytes, not its name)
    width: int
    height: int
    mpp: float | None  # um/px from trustworthy metadata, else None
    mpp_source: str  # which field gave `mpp` ("PNG pHYs", "JPEG JFIF density", ...); "" without
    ignored: str  # a resolution that was found but not trusted, and why; "" when none
    whole_px: int  # pixels a decoder holds at once (a band of rows, a strip, or the whole image)
    whole_why: str  # what makes it hold that much ("an interlaced PNG"); "" for a band of rows

    def describe_mpp(self) -> str:
        """'8 um/px (PNG pHYs)', or what the metadata lacks."""
        if self.mpp is not None:
            return f"{self.mpp:.4g} um/px ({self.mpp_source})"
        return self.ignored or f"no resolution in its {self.format} metadata"


def image_format(path: Path) -> str | None:
    """'PNG', 'JPEG' or 'TIFF' by the file's first bytes; None for anything else."""
    with open(path, "rb") as fh:
        head = fh.read(8)
    if head.startswith(_PNG_MAGIC):
        return "PNG"
    if head.startswith(_JPEG_MAGIC):
        return "JPEG"
    if head[:4] in _TIFF_MAGIC:
        return "TIFF"
    return None


def read_image_header(path: Path, *, name: object = None) -> ImageHeader:
    """The header of the PNG, JPEG or TIFF at `path`; SlideError naming `name` (default: `path`) when it
    is none of them or its header cannot be read."""
    name = path if name is None else name
    kind = image_format(path)
    try:
        if kind == "PNG":
            return _png(path)
        if kind == "JPEG":
            return _jpeg(path)
        if kind == "TIFF":
            return _tiff(path)
    except SlideError:
        raise
    except Exception as exc:  # PIL and tifffile raise many types for a damaged header
        raise SlideError(
            f"{name}: cannot read its {kind} header ({type(exc).__name__}: {exc}); is the file complete?"
        ) from exc
    raise SlideError(f"{name}: not a PNG, JPEG or TIFF image (its first bytes say otherwise)")


def _png(path: Path) -> ImageHeader:
    from PIL import PngImagePlugin

    with open(path, "rb") as fh:
        # the plugin class itself: Image.open would refuse images over PIL's decompression-bomb limit,
        # and nothing is decoded here
        im = PngImagePlugin.PngImageFile(fh)
        w, h = im.size
        dpi = im.info.get("dpi")  # PIL gives pHYs in pixels per metre as dpi; absent for unit 0
    found = 25400.0 / float(dpi[0]) if dpi and dpi[0] else None
    interlaced = bool(im.info.get("interlace"))
    return _header(
        "PNG", w, h, found, "PNG pHYs", w * h if interlaced else w, "an interlaced PNG" * interlaced
    )


def _jpeg(path: Path) -> ImageHeader:
    from PIL import JpegImagePlugin

    with open(path, "rb") as fh:
        im = JpegImagePlugin.JpegImageFile(fh)
        w, h = im.size
        info: dict[str | tuple[int, int], Any] = dict(im.info)
        exif = im.getexif()
    found, source = None, "JPEG JFIF density"
    unit_um = _JFIF_UNIT_UM.get(int(info.get("jfif_unit", 0)))
    density = info.get("jfif_density")
    if unit_um and density and density[0]:
        found = unit_um / float(density[0])
    else:
        unit_um = _EXIF_UNIT_UM.get(int(exif.get(_EXIF_UNIT, 0) or 0))
        xres = exif.get(_EXIF_XRES)
        if unit_um and xres and float(xres) > 0:
            found, source = unit_um / float(xres), "JPEG EXIF resolution"
    progressive = bool(info.get("progressive") or info.get("progression"))
    band = w * h if progressive else w * min(h, _JPEG_ROWS)
    return _header("JPEG", w, h, found, source, band, "a progressive JPEG" * progressive)


def _tiff(path: Path) -> ImageHeader:
    import tifffile

    with tifffile.TiffFile(path) as tif:
        page = tif.pages.first
        w, h = int(page.imagewidth), int(page.imagelength)
        if page.is_tiled:
            band, why = int(page.tilewidth) * int(page.tilelength), "a TIFF tile"
        else:
            tag = page.tags.get("RowsPerStrip")
            rows = min(h, int(tag.value) if tag is not None else h)
            band, why = w * rows, f"a TIFF stored in strips of {rows} rows"
    return _header("TIFF", w, h, tiff_resolution_um(path), "TIFF resolution tags", band, why)


def _header(
    fmt: str, w: int, h: int, found: float | None, source: str, whole_px: int, whole_why: str
) -> ImageHeader:
    lo, hi = PLAUSIBLE_MPP
    if found is not None and math.isfinite(found) and lo <= found <= hi:
        return ImageHeader(fmt, w, h, found, source, "", whole_px, whole_why)
    ignored = ""
    if found is not None:
        dpi = 25400.0 / found if found > 0 else float("nan")
        ignored = (
            f"its {source} of {dpi:.3g} dpi ({found:.4g} um/px) is not a microscope's or slide scanner's "
            f"({lo:g}-{hi:g} um/px) but a default image software writes, so it is not used"
        )
    return ImageHeader(fmt, w, h, None, "", ignored, whole_px, whole_why)


__all__ = ["ImageHeader", "image_format", "read_image_header"]

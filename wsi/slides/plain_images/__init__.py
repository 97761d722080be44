"""Plain images (PNG, JPEG, a TIFF in strips) read as one-level slides.

A thumbnail, an exported region or a camera picture of a slide is tiled, embedded and predicted like any
whole-slide image: `wsi.slides.slide.open_slide` reads its header here (`header`: size, and a resolution only
where the metadata can be trusted, else the user's --mpp), and reads its pixels from a tiled pyramid made
once in the local cache (`pyramid`), never decoding the whole image at once.

    is_image_slide(path) -> bool              a plain image rather than a whole-slide format
    read_image_header(path) -> ImageHeader    format, size, trusted mpp (or what was ignored and why)
    image_pyramid(path, header) -> (pyramid.tif, hold)   the cached pyramid; close `hold` when done
    image_mpp_hint(path, header) -> str       the refusal when neither metadata nor --mpp gives um/px
    open_image(name, file, mpp, make) -> make(file=pyramid, hold=, image=header)   for `wsi.slides.slide`
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from wsi.core.errors import MissingMppError
from wsi.core.suffixes import IMAGE_SLIDE_SUFFIXES
from wsi.slides.plain_images.header import ImageHeader, image_format, read_image_header
from wsi.slides.plain_images.pyramid import check_decodable, image_pyramid

_TIFF_SUFFIXES = (".tif", ".tiff")
_T = TypeVar("_T")


def is_image_slide(path: Path) -> bool:
    """Whether the local file `path` is read as a plain image: a .png/.jpg/.jpeg, or a .tif/.tiff that no
    whole-slide format claims (openslide detects none: a TIFF in strips, which openslide cannot read and
    tiffslide would decode a strip per tile). A tiled single-level TIFF stays a generic-tiff slide."""
    suffix = path.suffix.lower()
    if suffix in IMAGE_SLIDE_SUFFIXES:
        return True
    if suffix not in _TIFF_SUFFIXES or image_format(path) != "TIFF":
        return False
    import openslide

    return openslide.OpenSlide.detect_format(str(path)) is None


#: how to give a plain image its resolution
MPP_FIX = (
    "pass the resolution with --mpp (um/px: e.g. --mpp 8 for a slide thumbnail at 8 um/px, 0.5 for a 20x "
    "region) or an `mpp` column in a slide list CSV"
)


def image_mpp_hint(path: object, header: ImageHeader) -> str:
    """Why a plain image cannot be tiled without --mpp, naming the file and the fix."""
    return (
        f"{path}: a plain {header.format} image of {header.width} x {header.height} px: "
        f"{header.describe_mpp()}; {MPP_FIX}"
    )


def open_image(name: object, file: Path, mpp: float | None, make: Callable[..., _T]) -> _T:
    """`make(file=pyramid, hold=hold, image=header)` (a `Slide`) for the plain image `file`, named `name`
    in messages.

    Without `mpp` and a trusted resolution in its header, MissingMppError before any pixel is decoded.
    `hold` keeps the pyramid in the cache while it is read: the slide closes it (here, if `make` fails).
    """
    header = read_image_header(file, name=name)
    if mpp is None and header.mpp is None:
        raise MissingMppError(image_mpp_hint(name, header))
    pyramid, hold = image_pyramid(file, header, name=name)
    try:
        return make(file=pyramid, hold=hold, image=header)
    except BaseException:
        hold.close()
        raise


__all__ = [
    "MPP_FIX", "ImageHeader", "check_decodable", "image_format", "image_mpp_hint", "image_pyramid",
    "is_image_slide", "open_image", "read_image_header",
]  # fmt: skip

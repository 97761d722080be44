"""A slide's summary, as `wsi info SLIDE` prints it: vendor, levels, size, mpp and where it came from.

What a user checks before tiling: is the resolution right (and from where: the scanner's metadata, TIFF
resolution tags, or nothing at all), how many pyramid levels are there, what objective was used, and
which reader opens the file. A plain image (PNG, JPEG, TIFF in strips) is described from its header
alone: nothing is decoded, its pyramid is made when it is first tiled.
"""

from __future__ import annotations

import os
from pathlib import Path

from wsi.core.errors import MissingMppError
from wsi.core.json_types import JsonObject
from wsi.slides.plain_images import MPP_FIX, is_image_slide, read_image_header
from wsi.slides.plain_images.pyramid import pyramid_dir
from wsi.slides.slide import open_slide

#: properties giving the objective power, by reader
_OBJECTIVE_KEYS = ("openslide.objective-power", "tiffslide.objective-power", "aperio.AppMag")


def slide_info(
    path: str | os.PathLike[str], *, backend: str = "openslide", mpp: float | None = None
) -> JsonObject:
    """An ordered summary of a whole-slide image. Raises SlideError when it is not a readable slide.

    A slide without a resolution in its metadata is still described; its mpp says so and how to give it.
    """
    path = Path(path)
    if path.is_file() and is_image_slide(path):
        return _image_info(path, mpp)
    try:
        slide = open_slide(path, backend=backend, mpp=mpp)
        missing = False
    except MissingMppError:  # still worth describing: open it with a stand-in to read the rest
        slide = open_slide(path, backend=backend, mpp=1.0)
        missing = True
    with slide:
        w, h = slide.dimensions
        out: JsonObject = {
            "file": str(path),
            "kind": f"slide ({slide.vendor})",
            "backend": slide.backend,
            "vendor": slide.vendor,
            "size_px": f"{w} x {h}",
        }
        if missing:
            out["mpp"] = "unknown: none in the metadata; give --mpp (e.g. 0.25 for a 40x scan, 0.5 for 20x)"
        else:
            out["mpp"] = round(slide.mpp, 6)
            out["mpp_source"] = slide.mpp_source
            out["size_mm"] = f"{w * slide.mpp / 1000:.2f} x {h * slide.mpp / 1000:.2f}"
        props = slide.properties
        objective = next((props[k] for k in _OBJECTIVE_KEYS if props.get(k)), None)
        out["objective_power"] = objective if objective is not None else "not in the metadata"
        out["levels"] = len(slide.level_dimensions)
        for i, ((lw, lh), ds) in enumerate(zip(slide.level_dimensions, slide.level_downsamples, strict=True)):
            level_mpp = "" if missing else f", {slide.mpp * ds:.4g} um/px"
            tile = props.get(f"{slide.backend}.level[{i}].tile-width")
            tiled = f", {tile} px tiles" if tile else ""
            out[f"level {i}"] = f"{lw} x {lh} px, downsample {ds:g}{level_mpp}{tiled}"
        if slide.colour_fix:
            out["colour"] = slide.colour_fix.note
    return out


def _image_info(path: Path, mpp: float | None) -> JsonObject:
    """A plain image's summary from its header (`wsi.slides.plain_images`)."""
    from wsi.storage.settings import storage_settings

    header = read_image_header(path)
    out: JsonObject = {
        "file": str(path),
        "kind": f"plain {header.format} image, read as a one-level slide",
        "vendor": f"plain-{header.format.lower()}",
        "size_px": f"{header.width} x {header.height}",
    }
    used = mpp if mpp is not None else header.mpp
    if used is None:
        out["mpp"] = f"unknown: {header.describe_mpp()}; {MPP_FIX}"
    else:
        out["mpp"] = round(used, 6)
        out["mpp_source"] = "given" if mpp is not None else header.mpp_source
        out["size_mm"] = f"{header.width * used / 1000:.2f} x {header.height * used / 1000:.2f}"
        if mpp is not None and header.mpp is None and header.ignored:
            out["metadata"] = header.ignored
    out["levels"] = 1
    band = "the whole image at once" if header.whole_why else "a band of rows at a time"
    out["decoding"] = f"{band} ({header.whole_px / 1e6:.3g} megapixels)"
    pyramid = pyramid_dir(path, storage_settings()) / "pyramid.tif"
    out["pyramid"] = str(pyramid) if pyramid.is_file() else "made in the local cache when first tiled"
    return out

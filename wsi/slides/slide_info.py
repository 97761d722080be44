"""A slide's summary, as `wsi info SLIDE` prints it: vendor, levels, size, mpp and where it came from.

What a user checks before tiling: is the resolution right (and from where: the scanner's metadata, TIFF
resolution tags, or nothing at all), how many pyramid levels are there, what objective was used, and
which reader opens the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from wsi.core.errors import MissingMppError
from wsi.core.json_types import JsonObject
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

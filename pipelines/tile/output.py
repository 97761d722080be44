"""What the tile stage writes besides the grid: the tile file's attributes and the --save-tiles writer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from wsi.core.version import __version__
from wsi.formats.tile_file import PixelStoreAttrs, TilePixelWriter
from wsi.formats.tile_meta import TileFileMeta
from wsi.slides.slide import Slide
from wsi.slides.sources import SlideSource
from wsi.tiling.grid import TileCounts
from wsi.tiling.params import TileParams


def pixel_writer(path: Path, params: TileParams, slide_id: str, n_max: int) -> TilePixelWriter:
    return TilePixelWriter(
        path,
        n_max=n_max,
        tile_px=params.tile_px,
        attrs=PixelStoreAttrs(
            slide_id=slide_id,
            tile_size_um=params.tile_um,
            tile_size_px=params.tile_px,
            target_mpp=params.target_mpp,
            params=json.dumps(params.to_dict(), sort_keys=True),  # a JSON string, as in the .h5
        ),
    )


def tile_file_meta(
    slide: Slide,
    source: SlideSource,
    params: TileParams,
    counts: TileCounts,
    mpp_source: str,
    **sections: Any,
) -> TileFileMeta:
    """The tile file's record of this slide and its tiles; `sections` are TileFileMeta's optional fields
    (background, empty_reason, damage, roi, segmentation, ...)."""
    w0, h0 = slide.dimensions
    return TileFileMeta(
        slide_id=source.slide_id,
        slide_path=str(source.path),
        tile_um=float(params.tile_um),
        tile_px=int(params.tile_px),
        mpp=float(slide.mpp),
        mpp_source=mpp_source,
        target_mpp=float(params.target_mpp),
        level0_width=int(w0),
        level0_height=int(h0),
        backend=slide.backend,
        vendor=slide.vendor,
        params=params.to_dict(),
        counts=counts,
        wsi_version=__version__,
        **sections,
    )


__all__ = ["pixel_writer", "tile_file_meta"]

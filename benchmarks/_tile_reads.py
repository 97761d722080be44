"""The tile stage's reader alone, without filters or outputs: the ceiling every tile benchmark compares
with (tile_throughput.py and tile_ceiling.py both time it)."""

from __future__ import annotations

import numpy as np

from wsi.pipelines.scheduling.results import JobResult
from wsi.pipelines.tile.stage import read_tile_chunks
from wsi.slides.slide import open_slide
from wsi.slides.sources import SlideSource
from wsi.tiling.params import TileParams


def raw_read(
    source: SlideSource, *, coords: np.ndarray, backend: str, threads: int, direct_jpeg: bool = True
) -> JobResult:
    """Read the tiles and do nothing else (the stage's reader, without filters or output)."""
    params = TileParams()
    n = 0
    with open_slide(source.path, backend=backend, direct_jpeg=direct_jpeg) as slide:
        for chunk in read_tile_chunks(slide, coords, params, threads):
            n += len(chunk)
    return JobResult(source.slide_id, str(source.path), "ok", n=n)

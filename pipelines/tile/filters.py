"""The tile stage's read-and-filter step: every candidate tile read once, judged by the filters, and with
--save-tiles the kept pixels streamed into the zarr (committed only when the slide passes).

    filter_tiles(slide, found, job, zarr_path, slide_id, artifacts=None) -> (reasons, counts, damage)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wsi.pipelines.tile.artifacts import count_reasons
from wsi.pipelines.tile.checks import check_damage, file_damage
from wsi.pipelines.tile.output import pixel_writer
from wsi.pipelines.tile.read import Judging, classified_chunks
from wsi.slides.slide import Slide
from wsi.slides.tiff_tiles import FileDamage, FileTileProbe
from wsi.tiling.blur import blur_reduction
from wsi.tiling.grid import KEPT, TileCounts, TissueGrid

if TYPE_CHECKING:
    from wsi.pipelines.tile.job import TileJob


def filter_tiles(
    slide: Slide,
    found: TissueGrid,
    job: TileJob,
    zarr_path: Path,
    slide_id: str,
    artifacts: np.ndarray | None = None,
    colours: np.ndarray | None = None,
) -> tuple[np.ndarray, TileCounts, FileDamage | None]:
    """(M,) reason code per candidate, the counts and what could not be decoded (None: all was); with
    --save-tiles the kept pixels stream into the zarr, which is committed only when the slide passes
    (else removed, leaving no partial pixels). artifacts: (M,) an artifact network's verdicts (KEPT: read).
    colours: (M,) uint8 each candidate's ink colour (`TissueGrid.region_colours` on entry), changed in
    place where a tile's own pixels make it ink."""
    params = job.params
    if found.background.white_level is not None:  # a faint slide's own near-white level (background)
        params = dataclasses.replace(params, white_level=found.background.white_level)
    every, read_colours = found, colours
    if artifacts is not None:
        keep = artifacts == KEPT
        found = found.restricted(keep)
        read_colours = colours[keep] if colours is not None else None
    writer = pixel_writer(zarr_path, job.params, slide_id, len(found.candidates)) if job.save_tiles else None
    try:
        reasons = np.empty(len(found.candidates), dtype=np.int8)  # (M,)
        done = 0
        kind = found.background
        probe = FileTileProbe(slide, slide.best_level_for_mpp(params.target_mpp))
        judging = Judging(
            dark=kind.dark, gain=kind.gain, region_codes=found.region_codes, signal_level=kind.signal_level,
            blur_reduce=blur_reduction(slide.mpp, params.target_mpp, params.tile_px), colours=read_colours,
        )  # fmt: skip
        chunks = classified_chunks(
            slide, found.candidate_coords, params, job.threads, judging=judging, probe=probe
        )
        for tiles, chunk_reasons in chunks:
            reasons[done : done + len(tiles)] = chunk_reasons
            done += len(tiles)
            if writer is not None:
                writer.append(tiles[chunk_reasons == KEPT])
        if artifacts is not None:
            reasons, read = artifacts.copy(), reasons
            reasons[artifacts == KEPT] = read
            if colours is not None and read_colours is not None:
                colours[artifacts == KEPT] = read_colours
        counts = count_reasons(every, reasons)
        damage = file_damage(slide, found, probe) if counts.n_unreadable else None
        if damage is not None:
            check_damage(slide.path, counts, damage, params)
        if writer is not None:  # only a slide that passed commits its tile pixels
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return reasons, counts, damage


__all__ = ["filter_tiles"]

"""A slide's embedding work: the bags one read of its tiles makes (one per encoder that still needs it),
what each bag records of how it was made, and whether the slide file is still the one planned."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np

from wsi.core.errors import WsiError
from wsi.core.json_types import JsonObject
from wsi.formats.bags import BagProvenance
from wsi.formats.tile_file import coords_digest
from wsi.models.encoders.stain import StainReference
from wsi.pipelines.embed.batches import SlideTiles
from wsi.pipelines.embed.config import EmbedOptions
from wsi.pipelines.embed.runtime import Runtime
from wsi.pipelines.embed.stain import stain_fields
from wsi.pipelines.scheduling.results import JobResult
from wsi.storage.identity import SlideFingerprint, fingerprint

__all__ = ["BagWrite", "SlideJob", "SlideWork", "WorkResult", "bag_provenance", "replaced_since"]


@dataclass(frozen=True)
class SlideJob:
    """One bag: the tiles to read, the bag to write, and the tile-file facts its provenance records."""

    tiles: SlideTiles
    bag_path: Path
    coords_um: np.ndarray  # (N, 2) float32, from the tile file
    tile_params: JsonObject  # the tile stage's parameters, which made these coordinates
    level0_size: tuple[int, int] = (0, 0)  # the slide's (width, height) at level 0, px
    tile_file: str | None = None  # the tile file the coordinates came from
    #: the slide file as the tile file recorded it, checked against the file now before the plan
    fingerprint: SlideFingerprint | None = None


@dataclass(frozen=True)
class SlideWork:
    """One slide, read once, for the bags of the encoders that still need it (jobs[k] for runtime k)."""

    jobs: tuple[SlideJob | None, ...]

    @property
    def tiles(self) -> SlideTiles:
        return next(job for job in self.jobs if job is not None).tiles


@dataclass
class WorkResult(JobResult):
    """The outcome of a SlideWork as one JobResult (what run_jobs carries back from a dask worker)."""

    bags: tuple[JobResult | None, ...] = ()


def bag_provenance(
    job: SlideJob,
    rt: Runtime,
    options: EmbedOptions,
    n_bad: int,
    *,
    stain: StainReference | None = None,
    stain_fallback: int | None = None,
) -> BagProvenance:
    """How this slide's bag was made: the tile file's facts, the encoder's (`Encoder.provenance`, with its
    recipe and the recipe's digest), the stain normalisation and this run's, in one place."""
    st, enc = job.tiles, rt.encoder.provenance()
    return BagProvenance(
        slide_id=st.slide_id,
        encoder=enc["encoder"],
        weights_sha256=enc["weights_sha256"],
        tile_size_um=st.tile_size_um,
        tile_size_px=st.tile_px,
        mpp=st.mpp,
        level0_width=job.level0_size[0],
        level0_height=job.level0_size[1],
        tile_params=job.tile_params,
        target_mpp=st.target_mpp,
        encoder_id=enc["encoder_id"],
        input_px=enc["input_px"],
        precision="fp32" if rt.autocast is None else options.precision,
        n_tiles_requested=st.n,
        n_bad_tiles=n_bad,
        pixel_source="tile-cache" if st.pixels_path else "slide",
        slide_path=st.slide_path,
        tile_file=job.tile_file,
        tiles_sha256=coords_digest(st.coords_px),
        encoder_recipe=enc["recipe"],
        recipe_sha256=enc["recipe_sha256"],
        **stain_fields(stain, stain_fallback),
        **(job.fingerprint.as_attrs() if job.fingerprint is not None else {}),  # type: ignore[arg-type]
    )


class BagWrite(TypedDict):
    """`wsi.formats.bags.write_bag`'s arguments besides the path: one finished bag."""

    feats: np.ndarray  # (n_ok, D)
    coords_um: np.ndarray  # (n_ok, 2)
    coords_px: np.ndarray  # (n_ok, 2)
    provenance: BagProvenance
    dtype: str


def replaced_since(work: SlideWork) -> str:
    """Why the slide's file is no longer the one planned (its size or version changed while its tiles
    were read: the bag would mix two files), "" when it is the same. One stat or HEAD per slide."""
    job = next(j for j in work.jobs if j is not None)
    before = job.fingerprint
    if before is None:
        return ""
    try:
        now = fingerprint(job.tiles.slide_path, header=False)
    except (OSError, WsiError):
        return f"the slide file {job.tiles.slide_path} disappeared while its tiles were read; no bag written"
    if (now.size, now.version) == (before.size, before.version):
        return ""
    return (
        f"the slide file {job.tiles.slide_path} was replaced while its tiles were read ({before.size} bytes, "
        f"{before.version} -> {now.size} bytes, {now.version}); no bag written: run `wsi tile` again (it "
        "re-tiles a changed slide), then `wsi embed`"
    )

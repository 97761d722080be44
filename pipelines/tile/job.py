"""What every slide of a tile run shares (`TileJob`, sent to each worker) and where one slide's outputs go
(`TileOutputs`); apart from the stage so that its steps (filters.py, review.py) can name them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from wsi.core.work_bounds import MAX_READ_PX
from wsi.pipelines.tile.segment import SegmentationOptions
from wsi.tiling.params import TileParams


@dataclass(frozen=True)
class TileOutputs:
    h5: Path
    zarr: Path
    qc: Path
    geojson: Path  # the QC picture's content as QuPath objects (pipelines.tile.qupath)


def remote_files(slide_id: str) -> tuple[list[str], str]:
    """One slide's outputs relative to --out, and its done file (the tile file): what a remote --out
    pulls and pushes per slide (`wsi.pipelines.scheduling.remote`)."""
    paths = output_paths("", slide_id)
    return [paths.qc.as_posix(), paths.geojson.as_posix()], paths.h5.as_posix()


def output_paths(out_dir: str | os.PathLike[str], slide_id: str) -> TileOutputs:
    out = Path(out_dir)
    return TileOutputs(
        out / "tiles" / f"{slide_id}.h5", out / "tiles" / f"{slide_id}.zarr", out / "qc" / f"{slide_id}.png",
        out / "qc" / f"{slide_id}.geojson",
    )  # fmt: skip


@dataclass(frozen=True)
class TileJob:
    """Settings shared by every slide of a run (sent to each worker with the slide)."""

    out_dir: Path
    params: TileParams = field(default_factory=TileParams)
    backend: str = "openslide"
    #: level-0 um/px for slides whose metadata has none (a record's own `mpp` wins)
    fallback_mpp: float | None = None
    save_tiles: bool = False
    overwrite: bool = False
    #: reader threads per slide
    threads: int = 1
    #: "auto": tell brightfield from dark-background (fluorescence-like) slides per slide; "light" or
    #: "dark" forces one kind (not a TileParams field: it describes the slide, like its mpp)
    background: str = "auto"
    #: QuPath GeoJSON annotations restricting the tiles: one file, or a folder of <slide_id>.geojson
    roi: Path | None = None
    #: a reviewed qc/<slide_id>.geojson exported from QuPath, or a folder of them (`pipelines.tile.review`)
    review: Path | None = None
    #: use fallback_mpp (--mpp) for slides whose metadata has an mpp too (--mpp-override)
    mpp_override: bool = False
    #: tissue / artifact segmentation networks (`wsi.pipelines.tile.segment`); None: none
    segmentation: SegmentationOptions | None = None
    #: the URL of a remote --out (s3://...): each worker writes into its own mirror of it (`out_dir`
    #: replaced) and uploads each slide's files (`wsi.pipelines.scheduling.remote`); None: out_dir is the
    #: output
    remote: str | None = None
    #: the most pixels of one level decoded for the thumbnail (`wsi.slides.thumbnail.check_thumbnails`)
    max_read_px: int = MAX_READ_PX


__all__ = ["TileJob", "TileOutputs", "output_paths", "remote_files"]

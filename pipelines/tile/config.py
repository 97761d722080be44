"""The tiling run's settings (how to read and schedule), beside `wsi.tiling.TileParams` (which tiles to
keep, stored in every tile file). `wsi tile` builds its options from both, so each default, range and
help text is written once, here or there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from wsi.config import MAX_MPP, config_model, setting
from wsi.work_bounds import MAX_READ_PX

Backend = Literal["openslide", "tiffslide"]
BackgroundChoice = Literal["auto", "light", "dark"]


@config_model
@dataclass(frozen=True)
class TileOptions:
    """How a tiling run reads and schedules slides; none of it changes which tiles are kept but --roi and
    --review, which name files of the user's, recorded per slide in its tile file (path and sha256)."""

    backend: Backend = setting("openslide", help="Slide reader.")
    mpp: float | None = setting(
        None,
        gt=0,
        le=MAX_MPP,
        help="Level-0 um/px for slides whose metadata has none (a CSV `mpp` column wins; a slide's metadata "
        "wins over --mpp, and the log says so, unless --mpp-override).",
    )
    workers: int = setting(
        1, ge=1, le=1024, help="Slides processed in parallel (local dask worker processes)."
    )
    scheduler: str | None = setting(
        None, help="Run on an existing dask.distributed cluster (e.g. tcp://host:8786)."
    )
    threads: int | None = setting(
        None, ge=1, le=1024, default_text="cores / workers, at most 4", help="Reader threads per slide."
    )
    save_tiles: bool = setting(False, help="Also store the kept tiles' pixels (zarr) for embedding.")
    overwrite: bool = setting(
        False,
        help="Redo slides whose output is already complete (also replaces another slide's tiles of the "
        "same id).",
    )
    mpp_override: bool = setting(
        False,
        help="Use --mpp for every slide, also those whose metadata has an mpp (a CSV mpp column still "
        "wins). Without it the metadata wins and the log says so.",
    )
    #: not a TileParams field: it describes the slide, like its mpp
    background: BackgroundChoice = setting(
        "auto",
        help="Slide background: auto detects per slide; light = brightfield (H&E on glass); dark = "
        "fluorescence-like (tissue shines on black).",
    )
    roi: Path | None = setting(
        None, existing="any",
        help="QuPath GeoJSON annotations (File > Export objects, level-0 px) to tile within: a file, or a "
        "folder of <slide_id>.geojson (a slide without its file fails). A tile is kept when its centre lies "
        "in an annotation and in none classed Exclude or Ignore* (any class ending in *, except Region*).",
    )  # fmt: skip
    review: Path | None = setting(
        None, existing="any",
        help="A reviewed qc/<slide_id>.geojson exported from QuPath (File > Export objects as GeoJSON), or a "
        "folder of <slide_id>.geojson: a tile classed kept is kept, any other class dropped, and so is every "
        "tile whose centre lies in an annotation classed Exclude or Ignore*; tiles not in the file keep the "
        "filters' verdict. Applied from the tile file, without reading the slide again.",
    )  # fmt: skip
    max_read_gpx: float = setting(
        MAX_READ_PX / 1e9, gt=0, le=10_000,
        help="Most gigapixels of one slide level decoded for its tissue thumbnail: a slide without a coarse "
        "enough pyramid level (or a header declaring far more pixels than the file holds) is refused, "
        "naming its size, instead of taking time in proportion to the pixels it declares.",
    )  # fmt: skip

    @property
    def max_read_px(self) -> int:
        return int(self.max_read_gpx * 1e9)

"""The tiling run's settings (how to read and schedule; which segmentation networks run), beside
`wsi.tiling.params.TileParams` (which tiles to keep, stored in every tile file). `wsi tile` builds its
options from all three, so each default, range, choice and help text is written once, here or there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from wsi.core.config import MAX_MPP, config_model, setting
from wsi.core.errors import ConfigError
from wsi.core.work_bounds import MAX_READ_PX
from wsi.tiling.params import ArtifactModel, TissueModel

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
    progress: bool = setting(True, help="Progress bars (--no-progress: none).")
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


@config_model
@dataclass(frozen=True)
class SegmentationOptions:
    """Which networks the tile stage runs (`wsi.pipelines.tile.segment`; picklable: sent to each worker
    with the job). Not TileParams fields: they name files, whose sha256 the tile file records."""

    tissue_model: TissueModel | None = setting(
        None,
        help="Tissue mask from this network (GrandQC's at 10 um/px, HEST's at 1 um/px) instead of saturation "
        "+ Otsu; its weights from --tissue-weights, else the Hugging Face cache.",
    )
    #: the CLI turns hf:ORG/REPO, a URL or nothing into the local file before building these options
    #: (`wsi.models.segmentation.named.segmenter_weights`)
    tissue_weights: str | Path | None = setting(
        None, default_text="the file `hf download MahmoodLab/hest-tissue-seg FILE` put in the cache",
        help="Its weights: GrandQC's Tissue_Detection_MPP10.pth or HEST's deeplabv3_seg_v4.ckpt, or "
        "hf:ORG/REPO.",
    )  # fmt: skip
    artifact_model: ArtifactModel | None = setting(
        None,
        help="Reject tiles covered by GrandQC's artifacts (fold, dark spot, pen, edge and air bubble, out of "
        "focus), run at 1 um/px (-mpp15: 1.5, -mpp2: 2); needs --artifact-weights but at 1 um/px (then the "
        "Hugging Face cache).",
    )
    artifact_weights: str | Path | None = setting(
        None,
        help="Its weights as a state dict (TRIDENT's GrandQC_MPP1_state_dict.pth); GrandQC's own .pth files "
        "are pickled models and are refused.",
    )  # fmt: skip
    #: any class but tissue and background is artifact
    max_artifact_fraction: float = setting(
        0.25, ge=0, le=1,
        help="Reject a tile when more than this share of it is artifact (with --artifact-model).",
    )  # fmt: skip
    #: `pipelines.devices.resolve_device`
    device: str = setting(
        "auto",
        help="Where the segmentation networks run: auto (CUDA, MPS, else CPU), cpu, cuda, cuda:N, mps."
    )

    def __post_init__(self) -> None:
        for what in ("tissue", "artifact"):
            name, weights = getattr(self, f"{what}_model"), getattr(self, f"{what}_weights")
            if (name is None) != (weights is None):
                raise ConfigError(f"--{what}-model and --{what}-weights go together; give both or neither")

    @property
    def active(self) -> bool:
        return self.tissue_model is not None or self.artifact_model is not None

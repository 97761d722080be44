"""The settings of a prediction run: one typed config that `predict()` validates its keywords against
and `wsi predict` builds its options from, so each default, range and help text is written once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from wsi.core.config import MAX_COUNT, MAX_MPP, config_model, setting

#: a bag of more tiles is read chunk by chunk (a million tiles in under 3 GB; the probabilities agree
#: with the in-memory forward to float rounding, a few 1e-6: its sums run in another order)
STREAM_ABOVE_TILES = 131_072


@config_model
@dataclass(frozen=True)
class PredictOptions:
    """How a trained run predicts slides or bags; the model itself comes from its run folder."""

    device: str = setting("auto", help="Device: auto (CUDA, MPS, CPU), cpu, cuda, cuda:N, mps.")
    heatmaps: bool = setting(True, help="Draw the per-slide heatmaps (--no-heatmaps skips them).")
    geojson: bool = setting(
        True, help="Write geojson/<slide>.geojson, the tiles as QuPath objects (--no-geojson skips them)."
    )
    weights: Path | None = setting(
        None, existing="file",
        help="Encoder weights for raw slides (must match the run's recorded sha256); refused for bags.",
    )  # fmt: skip
    slide_weights: str | None = setting(
        None, existing="any",
        help="Slide-encoder weights for raw slides, for a run trained on slide embeddings (sha256 checked).",
    )  # fmt: skip
    mpp: float | None = setting(
        None, gt=0, le=MAX_MPP, default_text="the run's",
        help="Level-0 um/px for slides whose metadata has none, and for bags in level-0 pixels (CLAM, "
        "TRIDENT); a labels CSV `mpp` column wins per slide.",
    )  # fmt: skip
    backend: Literal["openslide", "tiffslide"] = setting("openslide", help="Slide reader (raw slides).")
    workers: int = setting(1, ge=1, le=1024, help="Slides tiled/embedded in parallel (local dask workers).")
    scheduler: str | None = setting(None, help="Tile/embed on a dask.distributed cluster (e.g. tcp://host:8786).")
    progress: bool = setting(True, help="Progress bars (--no-progress: none).")
    labels_csv: Path | None = setting(
        None, existing="file",
        help="Label table of this cohort: score the predictions (external validation) and write the report.",
    )  # fmt: skip
    top_tiles: int = setting(
        0, ge=0, le=10_000,
        help="Save the K tiles pushing each class (or risk) most and least per slide, with a contact sheet.",
    )  # fmt: skip
    overwrite: bool = setting(
        False, help="Predict every slide again, also those finished by a run into --out."
    )
    allow_unfinished: bool = setting(
        False,
        help="Predict with a model folder whose training is still running or did not finish (its current "
        "best checkpoint); refused without it.",
    )
    stream_above_tiles: int | None = setting(
        STREAM_ABOVE_TILES, ge=1, le=MAX_COUNT,
        help="Read a slide's bag of more tiles from its file chunk by chunk, in bounded memory: the same "
        "prediction up to float rounding (within a few 1e-6: the sums run in another order), but no "
        "heatmap or top tiles for it (the manifest's note says so).",
    )  # fmt: skip

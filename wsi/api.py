"""The front door: the four stages and the everyday entry points as functions, one `import wsi` away.

    import wsi
    tiles = wsi.tile(["slides/"], out_dir="run")                       # TileResult: one row per slide
    bags = wsi.embed("run", out_dir="run", weights="best_ckpt.pth")     # EmbedResult (features/retccl/)
    run = wsi.train("nsclc-subtype", features_dir="run/features/retccl", labels_csv="labels.csv",
                    out_dir="model")                                     # TrainResult (metrics, weights)
    preds = wsi.predict(["new-slides/"], model_dir="model", out_dir="preds")   # PredictResult

Every stage takes its inputs first, then `out_dir`, then options (a typed config or its fields as
keywords) and returns a `StageResult`: one typed row per slide in `.results` (the result iterates over
them), where the outputs went, and `.problems`. Nothing heavy (torch, openslide, dask) is imported until
a function that needs it is called, so `import wsi` stays instant; the `list_*` functions need none.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wsi.formats.bags import Bag, Rows
    from wsi.pipelines.embed import EmbedResult
    from wsi.pipelines.predict.stage import PredictResult
    from wsi.pipelines.tile.findings import TileResult
    from wsi.pipelines.train.results import TrainResult
    from wsi.pipelines.zero_shot import PromptSet, RetrievalResult, ZeroShotResult
    from wsi.slides.slide import Slide
    from wsi.slides.sources import SlideSource

PathLike = str | os.PathLike[str]


def _sources(slides: PathLike | Sequence[PathLike | SlideSource]) -> list[SlideSource]:
    """Slide files, folders, CSV slide lists or URLs (or SlideSource records) as slide records."""
    from wsi.core.errors import WsiError
    from wsi.slides.sources import SlideSource, find_slides

    given = [slides] if isinstance(slides, str | os.PathLike) else list(slides)
    records = [s for s in given if isinstance(s, SlideSource)]
    paths = [s for s in given if not isinstance(s, SlideSource)]
    found = records + (find_slides(paths) if paths else [])
    if not found:
        raise WsiError(f"no slide files found in {', '.join(map(str, given)) or 'nothing given'}")
    return found


def tile(
    slides: PathLike | Sequence[PathLike | SlideSource], *, out_dir: PathLike, **settings: Any
) -> TileResult:
    """Find tissue and cut tiles of a physical size into `out_dir/tiles/` (a tile file and a QC picture
    per slide, and manifest.csv). `settings`: `params=TileParams(...)`, `options=TileOptions(...)` or
    their fields (tile_um, tile_px, mpp, workers, overwrite, ...), as `wsi tile` takes them."""
    from wsi.core.config import parse_config
    from wsi.pipelines.tile.stage import tile_slides
    from wsi.tiling.params import TileParams

    params = settings.pop("params", None)
    param_fields = {f: settings.pop(f) for f in list(settings) if f in TileParams.__dataclass_fields__}
    if param_fields:
        base = params.to_dict() if params is not None else {}
        params = parse_config(TileParams, {**base, **param_fields}, source="wsi.tile")
    return tile_slides(_sources(slides), out_dir=out_dir, params=params, **settings)


def embed(
    inputs: PathLike | Sequence[PathLike | SlideSource], *, out_dir: PathLike, **settings: Any
) -> EmbedResult:
    """Embed tiles into one HDF5 feature bag per slide and encoder (`out_dir/features/<encoder>/`).
    `inputs`: the output folder of `wsi.tile` (or its tiles/ folder), or slides, which are tiled first.
    `settings`: `options=EmbedOptions(...)` or its fields (encoder, weights, random_init, device, ...)."""
    from wsi.pipelines.embed import embed_tiles, tile_and_embed

    if isinstance(inputs, str | os.PathLike) and _is_tile_run(Path(inputs)):
        return embed_tiles(inputs, out_dir=out_dir, **settings)
    tiling = {k: settings.pop(k) for k in ("tile_params", "tile_options") if k in settings}
    return tile_and_embed(_sources(inputs), out_dir=out_dir, **tiling, **settings)


def _is_tile_run(folder: Path) -> bool:
    """A folder `wsi tile` wrote (it holds tiles/*.h5), or its tiles/ folder."""
    from wsi.core.suffixes import TILE_FILE_SUFFIX

    return any(next(d.glob(f"*{TILE_FILE_SUFFIX}"), None) for d in (folder, folder / "tiles") if d.is_dir())


def train(task: PathLike, *, labels_csv: PathLike, out_dir: PathLike, **settings: Any) -> TrainResult:
    """Train a task's model (a packaged task name such as "nsclc-subtype", or a task YAML) on labelled
    bags (`features_dir=`) or images (`images_dir=`); `settings`: TrainOptions fields (epochs, preset,
    cv, device, ...). Writes config.json, metrics.json, report.html and the weights into `out_dir`."""
    from wsi.pipelines.train import train as train_run

    labels, out = os.fspath(labels_csv), os.fspath(out_dir)
    return train_run(os.fspath(task), labels_csv=labels, out_dir=out, **settings)


def predict(
    inputs: PathLike | Sequence[PathLike] = (), *, model_dir: PathLike, out_dir: PathLike, **settings: Any
) -> PredictResult:
    """Predict slides (files, folders, CSV lists: tiled and embedded with the run's recorded settings) or
    bags (`features_dir=`) with a trained run folder; `settings`: PredictOptions fields (weights,
    labels_csv, top_tiles, ...). Writes predictions.csv, heatmaps/ and manifest.csv into `out_dir`."""
    from wsi.pipelines.predict.stage import predict as predict_run

    given = [os.fspath(inputs)] if isinstance(inputs, str | os.PathLike) else [os.fspath(i) for i in inputs]
    return predict_run(inputs=given, model_dir=os.fspath(model_dir), out_dir=os.fspath(out_dir), **settings)


def zero_shot(
    inputs: PathLike | Sequence[PathLike],
    *,
    out_dir: PathLike,
    prompts: PathLike | PromptSet,
    **settings: Any,
) -> ZeroShotResult:
    """Classes named in words (`prompts`: a YAML of classes and their prompts, or a packaged set such as
    "nsclc") score every bag or slide embedding in `inputs`, without training; `settings`: ZeroShotOptions
    fields (model, weights, top_k, labels_csv, ...). Writes predictions.csv, heatmaps/ and geojson/."""
    from wsi.pipelines.zero_shot import zero_shot as run

    return run(inputs, out_dir=out_dir, prompts=prompts, **settings)


def retrieve(inputs: PathLike | Sequence[PathLike], *, out_dir: PathLike, **settings: Any) -> RetrievalResult:
    """The tiles of a cohort's bags most like a text (`query="tumour-infiltrating lymphocytes"`) or a
    tile (`query_tile=(slide_id, x_um, y_um)`): top_tiles.csv and pictures in `out_dir`."""
    from wsi.pipelines.zero_shot import retrieve as run

    return run(inputs, out_dir=out_dir, **settings)


def open_slide(path: PathLike, **settings: Any) -> Slide:
    """A slide (openslide or tiffslide; DICOM series, plain images with `mpp=`), addressed in micrometres:
    `with wsi.open_slide("a.svs") as s: s.read_region_um(x0_px, y0_px, side_um, target_mpp)`."""
    from wsi.slides.slide import open_slide as open_any

    return open_any(path, **settings)


def read_bag(path: PathLike, *, mpp: float | None = None, rows: Rows = None, require_um: bool = True) -> Bag:
    """A feature bag (ours, STAMP's, CLAM's or TRIDENT's): `.feats` (N, D), `.coords_um` (N, 2), and
    the provenance it records (`wsi.formats.bags.read_bag`, loaded when called)."""
    from wsi.formats.bags import read_bag as read

    return read(path, mpp=mpp, rows=rows, require_um=require_um)


def list_encoders() -> list[str]:
    """Tile encoders `wsi.embed(encoder=...)` takes by name (weights are never downloaded)."""
    from wsi.models.encoders import list_encoders

    return list_encoders()


def list_text_encoders() -> list[str]:
    """Text towers `wsi.zero_shot(model=...)` takes by name."""
    from wsi.models.text_encoders import list_text_encoders

    return list_text_encoders()


def list_slide_encoders() -> list[str]:
    """Slide encoders `wsi embed-slides` takes by name."""
    from wsi.models.slide_encoders import list_slide_encoders

    return list_slide_encoders()


def list_models() -> list[str]:
    """Model presets `wsi.train(preset=...)` takes (configs/models/; the names `wsi.models.list_models`
    gives, read without importing the models)."""
    from wsi.configs import available

    return available("models")


def list_attention() -> list[str]:
    """Attention variants the transformer presets take (`attention=`)."""
    from wsi.models.attention import list_attention

    return list_attention()


def list_tasks() -> list[str]:
    """Packaged tasks `wsi.train` takes by name (configs/tasks/)."""
    from wsi.configs import available

    return available("tasks")


__all__ = [
    "embed",
    "list_attention",
    "list_encoders",
    "list_models",
    "list_slide_encoders",
    "list_tasks",
    "list_text_encoders",
    "open_slide",
    "predict",
    "read_bag",
    "retrieve",
    "tile",
    "train",
    "zero_shot",
]

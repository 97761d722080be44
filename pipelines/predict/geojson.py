"""geojson/<slide_id>.geojson of `wsi predict`: every tile of a slide as a QuPath tile object with its
measurements, the top tiles as annotations, the slide's prediction in the collection's properties.

All in level-0 pixels (the bag's `coords` where it stores them, else its micrometres over the slide's
mpp), so File > Import objects in QuPath lays them over the slide (`wsi.formats.qupath`). Per tile:
  "contribution <output>"  its additive share of each output (class, target or risk: the values the
                           heatmaps draw, `TaskKind.contribution_maps`)
  "pooling weight"         its attention-pooling weight, for models that pool by attention (ABMIL, CLAM,
                           DSMIL, DTFD-MIL)
  "attention"              instead of contributions, for a model explained by its attention (TransMIL)
Annotations: for each output the `k` tiles pushing it most ("most <output>") and least ("least
<output>"), named with their rank, as `pipelines.top_tiles` picks them. A slide whose tiles cannot be
placed (a pixel bag without its mpp) gets no file: a warning says why, and the prediction stands.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from wsi.core.errors import WsiError
from wsi.core.files import sanitize_slide_id
from wsi.formats.bags import open_bag_stream
from wsi.formats.qupath import (
    QuPathClass,
    feature_collection,
    ranked_tiles,
    tile_features,
)
from wsi.formats.qupath import write_geojson as write_collection
from wsi.pipelines.predict.run_model import ATTENTION
from wsi.pipelines.predict.top_tiles import pick
from wsi.pipelines.scheduling.devices import autocast_for

if TYPE_CHECKING:
    from wsi.pipelines.inputs import Batch, Item
    from wsi.pipelines.predict.run_model import RunModel

log = logging.getLogger(__name__)

#: top tiles per output and side when `wsi predict` was not asked for --top-tiles
DEFAULT_TOP = 5
POOLING_WEIGHT = "pooling weight"


def tile_geometry(bag_path: Path, mpp: float | None, n: int) -> tuple[np.ndarray, float]:
    """(N, 2) level-0 top-left px of a bag's tiles and their side in level-0 px; WsiError when the
    bag cannot be placed or does not hold the `n` tiles predicted."""
    bag = open_bag_stream(bag_path, mpp=mpp, require_um=False).bag
    slide_mpp = bag.mpp if bag.mpp else mpp
    if bag.coords_px is not None:
        coords = bag.coords_px.astype(np.float64)
    elif bag.coords_um is not None and slide_mpp:
        coords = bag.coords_um.astype(np.float64) / slide_mpp
    else:
        raise WsiError(
            f"{bag_path}: tile positions in level-0 pixels unknown (no pixel coords, no mpp); give --mpp"
        )
    if bag.tile_px0:
        size = float(bag.tile_px0)
    elif bag.tile_um and slide_mpp:
        size = float(bag.tile_um) / slide_mpp
    else:
        raise WsiError(f"{bag_path}: tile size in level-0 pixels unknown; give --mpp")
    if len(coords) != n:
        raise WsiError(f"{bag_path}: holds {len(coords)} tiles, {n} were predicted (bag changed?)")
    return coords, size


def pooling_weights(
    models: Sequence[torch.nn.Module], x: torch.Tensor, extra: Mapping[str, Any], device: torch.device
) -> np.ndarray | None:
    """(N,) mean attention-pooling weight of the first case's tiles over the models that have them."""
    found = [m for m in models if hasattr(m, "attention_weights")]
    if not found:
        return None
    xx = x.float() if x.dtype == torch.float16 else x
    with torch.inference_mode(), autocast_for(device)():
        weights = [m.attention_weights(xx, **extra)[0].float() for m in found]  # type: ignore[operator]
    return torch.stack(weights).mean(0).cpu().numpy()


def slide_collection(
    *,
    slide_id: str,
    coords_px: np.ndarray,
    size_px: float,
    maps: Mapping[str, np.ndarray],
    prediction: Mapping[str, Any],
    k: int = DEFAULT_TOP,
    weights: np.ndarray | None = None,
    effects: Mapping[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """The FeatureCollection of one slide: tiles (maps, weights, effects as measurements), top tiles."""
    columns: dict[str, np.ndarray] = {_column(name): np.asarray(v) for name, v in maps.items()}
    if weights is not None:
        columns[POOLING_WEIGHT] = np.asarray(weights)
    columns.update({f"tile effect {name}": np.asarray(v) for name, v in (effects or {}).items()})
    features = tile_features(coords_px, size_px, object_type="tile", measurements=columns)
    for name, values in maps.items():
        for side, idx in pick(np.asarray(values, dtype=np.float64), k).items():
            cls = QuPathClass.of(f"{side} {name}", (200, 0, 0) if side == "most" else (0, 90, 200))
            features += ranked_tiles(
                coords_px, size_px, idx, values, label=f"{side} {name}", cls=cls, column=_column(name)
            )
    props = {
        "slide_id": slide_id,
        "units": "level-0 pixels",
        "tile_size_px0": size_px,
        "prediction": dict(prediction),
    }
    return feature_collection(features, props)


def _column(name: str) -> str:
    """A map's measurement name: `contribution <output>`, or `attention` for a model explained by it."""
    return name if name == ATTENTION else f"contribution {name}"


def write_slide_geojson(
    out: Path,
    *,
    slide_id: str,
    bag_path: Path,
    mpp: float | None,
    maps: Mapping[str, np.ndarray],
    prediction: Mapping[str, Any],
    k: int = DEFAULT_TOP,
    weights: np.ndarray | None = None,
) -> list[str]:
    """Write out/geojson/<slide_id>.geojson; [its path relative to out], or [] with a warning when the
    slide's tiles cannot be placed (the prediction stands)."""
    n = len(next(iter(maps.values()))) if maps else 0
    try:
        coords, size = tile_geometry(bag_path, mpp, n)
        collection = slide_collection(
            slide_id=slide_id, coords_px=coords, size_px=size, maps=maps, prediction=prediction,
            k=k, weights=weights,
        )  # fmt: skip
    except WsiError as exc:
        log.warning("%s: no QuPath GeoJSON: %s", slide_id, exc)
        return []
    path = out / "geojson" / f"{sanitize_slide_id(slide_id)}.geojson"
    write_collection(path, collection)
    return [str(path.relative_to(out))]


def case_slide_geojson(
    run: RunModel,
    item: Item,
    batch: Batch,
    output: np.ndarray,
    maps: Mapping[str, np.ndarray],
    sl: slice,
    out: Path,
    top_tiles: int,
) -> list[str]:
    """`write_slide_geojson` for one slide of a predicted case (tokens `sl` of the case's batch)."""
    if run.adapter.name != "bags":
        return []
    kind = run.kind
    prediction: dict[str, Any] = {c: float(v) for c, v in zip(kind.output_columns, output, strict=True)}
    prediction.update(zip(kind.derived_columns(), kind.derived_cells(output), strict=True))
    # a model explained by attention has it in `maps` already (and it pools by no such weight)
    weights = None
    if ATTENTION not in maps:
        weights = pooling_weights(run.models, batch.x, batch.model_inputs(), run.device)
    mpp = getattr(run.adapter, "mpp_by_slide", {}).get(item.id, getattr(run.adapter, "mpp", None))
    return write_slide_geojson(
        out, slide_id=item.id, bag_path=item.path, mpp=mpp,
        maps={k: v[sl] for k, v in maps.items()}, prediction=prediction, k=top_tiles or DEFAULT_TOP,
        weights=None if weights is None else weights[sl],
    )  # fmt: skip


__all__ = [
    "DEFAULT_TOP",
    "POOLING_WEIGHT",
    "case_slide_geojson",
    "pooling_weights",
    "slide_collection",
    "tile_geometry",
    "write_slide_geojson",
]

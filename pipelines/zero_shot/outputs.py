"""A zero-shot run's files per slide: the tile scores as `wsi view` and QuPath read them, and heatmaps.

heatmaps/<slide>.json (wsi.formats.tile_values: each class's tile similarity, the predicted class named), one
heatmaps/<slide>_<class>.png per class (the similarity over the slide's thumbnail, predict's renderer), and
geojson/<slide>.geojson (every tile with `similarity <class>` measurements, and each class's top tiles as
annotations, as `wsi predict` lays them out).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.files import sanitize_slide_id
from wsi.formats.qupath import (
    QuPathClass,
    feature_collection,
    ranked_tiles,
    tile_features,
)
from wsi.formats.qupath import write_geojson as write_collection
from wsi.pipelines.zero_shot.config import ZeroShotOptions

log = logging.getLogger("wsi.pipelines.zero_shot")

SIMILARITY_LABEL = "cosine similarity to the class's prompts"


def write_slide_maps(
    out: Path,
    *,
    slide_id: str,
    bag: Any,
    maps: Mapping[str, np.ndarray],
    predicted: str,
    probs: Mapping[str, float],
    options: ZeroShotOptions,
) -> list[str]:
    """Write the slide's tile-value file and, as `options` ask, heatmaps and QuPath objects (each class's
    `top_k` tiles annotated); the paths written (relative to out). A slide that cannot be placed or drawn
    loses its pictures, not its prediction (logged)."""
    from wsi.formats.tile_values import write_tile_values

    sid = sanitize_slide_id(slide_id)
    written: list[str] = []
    if bag.coords_um is None or not bag.tile_um:
        log.warning(
            "%s: the bag has no tile positions in micrometres (give --mpp): no heatmap or QuPath objects",
            slide_id,
        )
        return written
    write_tile_values(
        out / "heatmaps" / f"{sid}.json",
        slide=slide_id,
        coords_um=bag.coords_um,
        tile_um=float(bag.tile_um),
        outputs=maps,
        mpp=bag.mpp,
        predicted=predicted,
    )
    written.append(f"heatmaps/{sid}.json")
    if options.heatmaps:
        written += _heatmaps(out, slide_id, bag, maps, probs)
    if options.geojson:
        path = _geojson(out, sid, slide_id, bag, maps, predicted, probs, options.top_k)
        if path:
            written.append(path)
    return written


def _heatmaps(
    out: Path, slide_id: str, bag: Any, maps: Mapping[str, np.ndarray], probs: Mapping[str, float]
) -> list[str]:
    """heatmaps/<slide>_<class>.png per class, over the slide's thumbnail when its file is at hand, else
    on a blank canvas; the ones drawn (a slide that cannot be read still has its scores)."""
    from wsi.pipelines.inputs.heatmaps import render_heatmap, slide_heatmap

    sid = sanitize_slide_id(slide_id)
    slide_path = bag.meta.get("slide_path") if isinstance(bag.meta, dict) else None
    written: list[str] = []
    for name, values in maps.items():
        png = out / "heatmaps" / f"{sid}_{sanitize_slide_id(name)}.png"
        title = f"{slide_id}: {name} (p={probs[name]:.3f})"
        try:
            if slide_path and Path(str(slide_path)).is_file():
                slide_heatmap(
                    (Path(str(slide_path)), bag.mpp),
                    bag.coords_um,
                    float(bag.tile_um),
                    values,
                    png,
                    title,
                    label=SIMILARITY_LABEL,
                )
            else:
                render_heatmap(
                    coords_um=bag.coords_um,
                    tile_um=float(bag.tile_um),
                    values=values,
                    out_png=png,
                    title=title,
                    label=SIMILARITY_LABEL,
                )
            written.append(str(png.relative_to(out)))
        except Exception as exc:
            log.warning("%s: heatmap %s not drawn (%s: %s)", slide_id, png.name, type(exc).__name__, exc)
    return written


def _geojson(
    out: Path,
    sid: str,
    slide_id: str,
    bag: Any,
    maps: Mapping[str, np.ndarray],
    predicted: str,
    probs: Mapping[str, float],
    k: int,
) -> str | None:
    mpp = bag.mpp
    if bag.coords_px is not None:
        coords = bag.coords_px.astype(np.float64)
    elif mpp:
        coords = bag.coords_um.astype(np.float64) / mpp
    else:
        log.warning("%s: tile positions in level-0 pixels unknown (no mpp): no QuPath objects", slide_id)
        return None
    size = float(bag.tile_px0) if bag.tile_px0 else float(bag.tile_um) / mpp if mpp else None
    if size is None:
        log.warning("%s: tile size in level-0 pixels unknown: no QuPath objects", slide_id)
        return None
    columns = {f"similarity {name}": np.asarray(v) for name, v in maps.items()}
    features = tile_features(coords, size, object_type="tile", measurements=columns)
    for name, values in maps.items():
        top = np.argsort(-np.asarray(values), kind="stable")[: min(k, len(values))]
        cls = QuPathClass.of(f"top {name}", (200, 0, 0))
        features += ranked_tiles(
            coords, size, top, np.asarray(values), label=f"top {name}", cls=cls, column=f"similarity {name}"
        )
    props = {
        "slide_id": slide_id,
        "units": "level-0 pixels",
        "tile_size_px0": size,
        "prediction": {"predicted": predicted, **{f"prob_{c}": p for c, p in probs.items()}},
    }
    path = out / "geojson" / f"{sid}.geojson"
    write_collection(path, feature_collection(features, props))
    return f"geojson/{sid}.geojson"

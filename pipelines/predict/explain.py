"""Per-tile explanations of one predicted case: heatmaps over the slide (or at the tile positions), the
tile values behind them, QuPath GeoJSON and top tiles, from the model's per-tile contributions (what
`wsi predict` draws for every case it loads whole).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wsi.pipelines.inputs import Batch, Item
from wsi.pipelines.inputs.heatmaps import ATTENTION_LABEL, CONTRIBUTION_LABEL, slide_heatmap, tile_values
from wsi.pipelines.predict.config import STREAM_ABOVE_TILES
from wsi.pipelines.predict.geojson import case_slide_geojson
from wsi.pipelines.predict.run_model import RunModel
from wsi.pipelines.predict.top_tiles import TopTiles, export_slide, recorded_slide
from wsi.pipelines.scheduling.jobs import describe_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CaseOptions:
    heatmaps: bool
    top_tiles: int
    thumbs: dict[str, tuple[Path, float | None]]
    backend: str
    stream_above: int | None = STREAM_ABOVE_TILES  # tiles; None: every bag loaded whole
    geojson: bool = True  # geojson/<slide>.geojson (QuPath objects)


def _parts(case: Item, sample: dict[str, Any]) -> list[tuple[Item, dict[str, Any], slice]]:
    """(slide item, its own sample with its own coordinates, its tiles' slice of the case's tokens)."""
    if "parts" not in sample:
        return [(case, sample, slice(None))]
    out = []
    for part in sample["parts"]:
        sl = slice(part["start"], part["stop"])
        coords = sample["coords_um"][sl].clone()
        coords[:, 0] -= part["shift_um"]  # back to the slide's own positions
        item = Item(id=part["id"], path=Path(part["path"]), patient=case.patient)
        out.append((item, {"x": sample["x"][sl], "coords_um": coords}, sl))
    return out


def explain_case(
    run: RunModel,
    case: Item,
    sample: dict[str, Any],
    batch: Batch,
    output: np.ndarray,
    out: Path,
    options: CaseOptions,
    tiles: TopTiles | None,
) -> list[str]:
    """Heatmaps and top tiles of each slide of a case, from the case's per-tile contributions; returns
    the heatmap files written (relative to `out`)."""
    heatmaps, maps = run.explain(batch.x, batch.model_inputs(), output)
    files: list[str] = []
    for item, part_sample, sl in _parts(case, sample):
        thumb = options.thumbs.get(item.id)
        if options.heatmaps:
            for suffix, values, title in heatmaps:
                png, label = out / "heatmaps" / f"{item.id}{suffix}.png", f"{item.id}: {title}"
                attention = run.explains_by == "attention"
                scale = ATTENTION_LABEL if attention else run.kind.heatmap_scale(suffix, output)
                picture = _Picture(png, title=label, label=scale)
                _heatmap(run, item, part_sample, batch, values[sl], picture, thumb, options)
                files.append(str(png.relative_to(out)))
            tile_values(item.id, item.path, part_sample, maps, sl, out, thumb, heatmaps)
        if options.geojson:
            files += case_slide_geojson(run, item, batch, output, maps, sl, out, options.top_tiles)
        if tiles is not None:
            try:
                export_slide(
                    slide_id=item.id, bag_path=item.path, maps={k: v[sl] for k, v in maps.items()},
                    k=options.top_tiles, out_dir=out / "top_tiles", slide=thumb, backend=options.backend,
                    collected=tiles,
                )  # fmt: skip
            except Exception as exc:  # the prediction stands; the crops are recorded as not made
                tiles.skipped.append((item.id, describe_error(exc)))
    return files


@dataclass(frozen=True)
class _Picture:
    """One heatmap's file and words: its title, and what a value means (under the colour bar)."""

    png: Path
    title: str
    label: str = CONTRIBUTION_LABEL


def _heatmap(
    run: RunModel,
    item: Item,
    sample: dict[str, Any],
    batch: Batch,
    values: np.ndarray,
    picture: _Picture,
    thumb: tuple[Path, float | None] | None,
    options: CaseOptions,
) -> None:
    """Values (N,) over the slide when it is reachable (the raw slide predicted, or the `slide_path` a
    bag of ours records), else drawn by the adapter (bags: at the tile positions; images: the image)."""
    png, title, label = picture.png, picture.title, picture.label
    if thumb is None and run.adapter.name == "bags" and "coords_um" in sample:
        slide_path, slide_mpp, _ = recorded_slide(item.path)
        thumb = None if slide_path is None else (slide_path, slide_mpp)
    if thumb is not None and "coords_um" in sample:
        from wsi.formats.bags import read_bag_attrs

        try:
            tile_um = float(sample.get("tile_um") or read_bag_attrs(item.path)["tile_size_um"])
            coords = sample["coords_um"].numpy()
            slide_heatmap(thumb, coords, tile_um, values, png, title, options.backend, label)
            return
        except Exception as exc:  # the slide is there but unreadable: the heatmap without it
            log.warning("%s: heatmap drawn without the slide (%s)", item.id, describe_error(exc))
    if hasattr(run.adapter, "heatmap"):
        grid = getattr(run.models[0], "grid_shape", None)
        extra: dict[str, Any] = {"grid_shape": grid(batch.x.shape)} if grid is not None else {}
        if run.adapter.name == "bags":  # what a value means (the image adapter draws its own)
            extra["label"] = label
        run.adapter.heatmap(item, sample, torch.from_numpy(values), png, title=title, **extra)


__all__ = ["CaseOptions", "explain_case"]

"""The overlays of one slide as JSON, every position in level-0 pixels, drawn by the page itself.

Sent as numbers rather than pictures so they stay sharp at every zoom: the kept tiles of the tile file,
the per-tile contributions of each output (a class, a target, the risk) that `wsi predict` drew its
heatmap PNGs from, the top tiles, the prediction, and QuPath GeoJSON objects (tissue outline and tile
fates from `wsi tile`, tile objects from `wsi predict`) passed through as they are.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TypedDict

import numpy as np

from wsi.core.errors import WsiError
from wsi.formats.tile_file import read_tile_file
from wsi.formats.tile_values import read_tile_values
from wsi.view.catalog import SlideEntry


class KeptTiles(TypedDict):
    size: float  # tile side, level-0 px
    xy: list[list[int]]  # top-left corners


class TileValuesJson(TypedDict):
    size: float  # tile side, level-0 px
    xy: list[list[float]]  # top-left corners
    outputs: dict[str, list[float | None]]  # output name -> per-tile contribution (None: not finite)
    predicted: str | None


class TopTileJson(TypedDict):
    output: str
    side: str
    rank: str
    x: float
    y: float
    size: float | None
    value: float
    file: str | None


class SlideOverlays(TypedDict):
    """What the page (static/viewer.js) draws over one slide."""

    id: str
    width: int
    height: int
    mpp: float
    prediction: dict[str, str]
    status: str
    error: str
    tiles: KeptTiles | None
    heat: TileValuesJson | None
    top_tiles: list[TopTileJson]
    geojson: list[str]  # layer names
    qc_png: str | None
    problems: list[str]


def _finite_list(values: np.ndarray, digits: int = 6) -> list[float | None]:
    """JSON numbers, None where not finite (JSON has no NaN)."""
    return [round(float(v), digits) if math.isfinite(v) else None for v in values.tolist()]


def kept_tiles(tile_file: Path) -> KeptTiles:
    """The tile file's kept tiles: top-left corners and side, level-0 px."""
    tiles = read_tile_file(tile_file)
    side = tiles.tile_um / tiles.mpp
    return {"size": side, "xy": tiles.coords.astype(np.int64).reshape(-1, 2).tolist()}


def tile_values(path: Path, mpp: float) -> TileValuesJson:
    """The per-tile contributions of `path` (`wsi.formats.tile_values`) in level-0 px; `mpp`: the slide's
    level-0 um/px, used when the file records none."""
    data = read_tile_values(path)
    mpp = data.mpp or mpp
    return {
        "size": data.tile_um / mpp,
        "xy": np.round(data.coords_um / mpp, 1).tolist(),
        "outputs": {name: _finite_list(values) for name, values in data.outputs.items()},
        "predicted": data.predicted,
    }


def top_tiles(entry: SlideEntry, mpp: float, tile_um: float | None) -> list[TopTileJson]:
    """top_tiles/index.csv rows of the slide, with their crop's URL under the folder."""
    out: list[TopTileJson] = []
    for row in entry.top_tiles:
        try:
            x, y = float(row["x0_px"]), float(row["y0_px"])
            value = float(row["contribution"])
        except (KeyError, ValueError):
            continue
        out.append({
            "output": row.get("output", ""), "side": row.get("side", ""), "rank": row.get("rank", ""),
            "x": x, "y": y, "size": None if tile_um is None else tile_um / mpp, "value": value,
            "file": f"top_tiles/{row['file']}" if row.get("file") else None,
        })  # fmt: skip
    return out


def slide_overlays(entry: SlideEntry, *, root: Path, width: int, height: int, mpp: float) -> SlideOverlays:
    """Everything the page draws over one slide (level-0 size `width` x `height`, `mpp` um/px); file
    URLs relative to the served folder `root`."""
    problems: list[str] = []
    out: SlideOverlays = {
        "id": entry.slide_id, "width": width, "height": height, "mpp": mpp,
        "prediction": entry.prediction, "status": entry.status, "error": entry.error,
        "tiles": None, "heat": None, "top_tiles": [], "geojson": sorted(entry.geojson),
        "qc_png": entry.qc_png.relative_to(root).as_posix() if entry.qc_png is not None else None,
        "problems": problems,
    }  # fmt: skip
    if entry.tile_file is not None:
        try:
            out["tiles"] = kept_tiles(entry.tile_file)
        except (WsiError, OSError, KeyError, ValueError) as exc:
            problems.append(f"tiles: {exc}")
    if entry.heatmap_json is not None:
        try:
            out["heat"] = tile_values(entry.heatmap_json, mpp)
        except WsiError as exc:
            problems.append(f"heatmap: {exc}")
    tile_um = None
    if out["heat"] is not None:
        tile_um = out["heat"]["size"] * mpp
    elif out["tiles"] is not None:
        tile_um = out["tiles"]["size"] * mpp
    out["top_tiles"] = top_tiles(entry, mpp, tile_um)
    return out


__all__ = [
    "KeptTiles",
    "SlideOverlays",
    "TileValuesJson",
    "TopTileJson",
    "kept_tiles",
    "slide_overlays",
    "tile_values",
    "top_tiles",
]

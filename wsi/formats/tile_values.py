"""Per-tile values of a slide as JSON: `heatmaps/<slide_id>.json`, beside the heatmap PNGs of `wsi predict`.

The PNGs are pictures at thumbnail size; this file keeps the numbers they were drawn from (each output's
value per tile, tile positions in micrometres), so `wsi view` draws them at full resolution and a script
reads them without HDF5. Its layout: docs/formats.md. Values that are not finite are written as null.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wsi.core.errors import WsiError
from wsi.core.files import write_text_atomic
from wsi.core.user_text import load_json_file

FORMAT = "wsi-tile-values"
FORMAT_VERSION = 1


@dataclass
class TileValues:
    slide: str
    tile_um: float
    mpp: float | None
    coords_um: np.ndarray  # (N, 2) float64
    outputs: dict[str, np.ndarray]  # name -> (N,) float64 (NaN where null)
    predicted: str | None = None


def write_tile_values(
    path: str | Path,
    *,
    slide: str,
    coords_um: np.ndarray,
    tile_um: float,
    outputs: Mapping[str, np.ndarray],
    mpp: float | None = None,
    predicted: str | None = None,
) -> None:
    """Write the file atomically; every output must have one value per tile."""
    coords = np.asarray(coords_um, dtype=np.float64).reshape(-1, 2)
    cols: dict[str, list[float | None]] = {}
    for name, values in outputs.items():
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        if len(v) != len(coords):
            raise ValueError(f"output {name}: {len(v)} values for {len(coords)} tiles")
        cols[str(name)] = [float(f"{x:.6g}") if math.isfinite(x) else None for x in v.tolist()]
    data = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "slide": slide,
        "tile_size_um": float(tile_um), "mpp": None if mpp is None else float(mpp),
        "coords_um": [[round(x, 3), round(y, 3)] for x, y in coords.tolist()],
        "outputs": cols, "predicted": predicted,
    }  # fmt: skip
    write_text_atomic(Path(path), json.dumps(data, separators=(",", ":"), allow_nan=False))


def read_tile_values(path: str | Path) -> TileValues:
    """Read and check the file; WsiError naming it when it is not one of these or is inconsistent."""
    path = Path(path)
    try:
        data = load_json_file(path, what="tile values", error=WsiError)  # size-capped, any parser failure
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        coords = np.asarray(data["coords_um"], dtype=np.float64).reshape(-1, 2)
        outputs = {
            str(k): np.asarray([np.nan if x is None else x for x in v], dtype=np.float64).reshape(-1)
            for k, v in data["outputs"].items()
        }
        for name, v in outputs.items():
            if len(v) != len(coords):
                raise ValueError(f"output {name} has {len(v)} values for {len(coords)} tiles")
        mpp = data.get("mpp")
        return TileValues(
            slide=str(data.get("slide", "")), tile_um=float(data["tile_size_um"]),
            mpp=None if mpp is None else float(mpp), coords_um=coords, outputs=outputs,
            predicted=data.get("predicted"),
        )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise WsiError(
            f"{path}: unreadable tile values ({exc}); run `wsi predict` again to rewrite it"
        ) from exc


__all__ = ["FORMAT", "FORMAT_VERSION", "TileValues", "read_tile_values", "write_tile_values"]

"""What QuPath writes when a user imports our qc/<slide_id>.geojson, edits it and exports it again (File >
Export objects as GeoJSON), emulated from QuPath's writer for the `wsi tile --review` tests: qupath/qupath
at e7662d89ec70ecb6b8fd0ee6bf01fdfb0acb7e4c, qupath-core/src/main/java/qupath/lib/io/ (PathIO,
QuPathTypeAdapters, GsonTools, ROITypeAdapters) and qupath-gui-fx/.../commands/ExportObjectsCommand.java."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np


def _number(v: float) -> float | int:
    """A coordinate as QuPath writes it: at most 2 decimals, an integer without ".0"
    (ROITypeAdapters.coordinateToString -> GeneralTools.formatNumber)."""
    r = round(float(v), 2)
    return int(r) if r == int(r) else r


def _numbers(nested: Any) -> Any:
    return [_numbers(v) for v in nested] if isinstance(nested, list) else _number(nested)


def qupath_export(qc: dict[str, Any], classes: dict[tuple[int, int], str], regions=()) -> dict[str, Any]:
    """What QuPath's File > Export objects as GeoJSON (All objects, FeatureCollection) writes after our qc
    file was imported and edited (qupath/qupath e7662d89ec70: PathObjectTypeAdapter.write,
    PathClassTypeAdapter.write, ROITypeAdapters): each feature "type", "id" (UUID), "geometry", then
    "properties" with "objectType", "name", "classification" {"name", "color"}, "isLocked" only when
    true, "measurements" as a map; the collection's own "properties" are not written back.
    classes: (x, y) top-left -> the class the reviewer gave that tile; regions: annotation rings drawn,
    as (ring, class name)."""
    colours = {"kept": [0, 170, 0], "blurry": [200, 0, 0], "ink": [255, 140, 0], "Ignore*": [180, 180, 180]}
    features = []
    for f in qc["features"]:
        props = f["properties"]
        geometry = {"type": f["geometry"]["type"], "coordinates": _numbers(f["geometry"]["coordinates"])}
        out: dict[str, Any] = {"objectType": props["objectType"]}
        if "name" in props:
            out["name"] = props["name"]
        name = props["classification"]["name"]
        if props["objectType"] == "tile":
            x, y = geometry["coordinates"][0][0]
            name = classes.get((int(x), int(y)), name)
        out["classification"] = {"name": name, "color": colours.get(name, props["classification"]["color"])}
        if props["objectType"] == "annotation":
            out["isLocked"] = True
        if "measurements" in props:
            out["measurements"] = {k: float(np.float32(v)) for k, v in props["measurements"].items()}
        features.append({"type": "Feature", "id": str(uuid.uuid4()), "geometry": geometry, "properties": out})
    for ring, name in regions:
        cls = {"name": name, "color": colours[name]}
        features.append({
            "type": "Feature", "id": str(uuid.uuid4()),
            "geometry": {"type": "Polygon", "coordinates": _numbers([ring])},
            "properties": {"objectType": "annotation", "classification": cls},
        })  # fmt: skip
    return {"type": "FeatureCollection", "features": features}


def fates(qc: dict[str, Any]) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for f in qc["features"]:
        if f["properties"]["objectType"] == "tile":
            x, y = f["geometry"]["coordinates"][0][0]
            out.setdefault(f["properties"]["classification"]["name"], []).append((int(x), int(y)))
    return out

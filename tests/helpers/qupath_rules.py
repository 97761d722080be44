"""What QuPath's "Import objects" requires of a GeoJSON file, written from its reader (not ours).

Source: qupath/qupath at e7662d89ec70ecb6b8fd0ee6bf01fdfb0acb7e4c (2026-08-07), qupath-core/src/main/java/
qupath/lib/io/:
- PathIO.readObjects: a file named *.geojson or *.json is read with readObjectsFromGeoJSON.
- GsonTools.addPathObjects: an array, or an object whose "type" is "Feature", "FeatureCollection" or a
  geometry type; other keys of a FeatureCollection are not read.
- QuPathTypeAdapters.PathObjectCollectionTypeAdapter.read: a FeatureCollection's "features" array.
- QuPathTypeAdapters.PathObjectTypeAdapter.parseObject: "id" (getAsString; a UUID or ignored);
  "geometry" (ROITypeAdapters); "properties" must be an object: "name" (string), "color" (an int or an
  array of 3 ints), "classification" (GsonTools.PathClassTypeAdapter), "isLocked" (boolean),
  "measurements" (array or object: MeasurementListTypeAdapter), "metadata" (object; primitives kept),
  "objectType" (or "object_type", "type"): tile, cell, tmaCore, detection, root, annotation; any other
  string is warned about and made an annotation.
- ROITypeAdapters.parseGeometry: "type" and "coordinates" (else IllegalArgumentException); Point,
  MultiPoint, LineString, MultiLineString, Polygon, MultiPolygon, GeometryCollection. Coordinates are
  [x, y] or [x, y, z] numbers (getAsDouble). JTS LinearRing: closed and 0 or >= 4 points.
- GsonTools.PathClassTypeAdapter.read: null, a string, or an object that is empty / has "colorRGB" /
  "parentClass" (old form), or has ("name" or "names") AND "color"; anything else throws
  JsonParseException ("Unable to parse PathClass"). PathClass: a name must not be blank nor contain
  ":" (the delimiter), "\\n", "\\r".
- MeasurementListTypeAdapter.read: an array of {"name": str, "value": number}, or an object whose values
  are numbers or strings that are "nan", "inf", "-inf" (any case) or Double.parseDouble-able
  ("NaN", "Infinity", "-Infinity", "1.5"); other values are warned about and dropped.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

OBJECT_TYPES = {
    "tile", "PathTileObject", "cell", "PathCellObject", "tmaCore", "tma_core", "TMACoreObject",
    "detection", "PathDetectionObject", "root", "PathRootObject", "annotation", "PathAnnotationObject",
}  # fmt: skip
GEOMETRY_TYPES = {
    "Point",
    "MultiPoint",
    "LineString",
    "MultiLineString",
    "Polygon",
    "MultiPolygon",
    "GeometryCollection",
}


_JAVA_DOUBLE = re.compile(r"^[+-]?(NaN|Infinity|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)[dDfF]?$")


class QuPathWouldFail(AssertionError):
    pass


def _need(ok: bool, why: str) -> None:
    if not ok:
        raise QuPathWouldFail(why)


def parse_file(path: Path) -> list[dict[str, Any]]:
    """The objects QuPath would import from `path`, each {objectType, classification, name, geometry_type,
    rings, measurements}; QuPathWouldFail where QuPath's reader throws or our file breaks its rules."""
    _need(
        path.suffix.lower() in (".geojson", ".json"), f"{path.name}: QuPath reads objects from .geojson/.json"
    )
    return parse(json.loads(path.read_text(encoding="utf-8")))


def parse(element: Any) -> list[dict[str, Any]]:
    if isinstance(element, list):
        return [o for item in element for o in parse(item)]
    _need(isinstance(element, dict) and isinstance(element.get("type"), str), "no 'type' string")
    kind = element["type"]
    if kind == "FeatureCollection":
        features = element.get("features")
        _need(isinstance(features, list), "FeatureCollection without a 'features' array")
        return [_feature(f) for f in features]
    if kind == "Feature":
        return [_feature(element)]
    _need(kind in GEOMETRY_TYPES, f"unknown top-level type {kind!r}")
    return [{"objectType": "annotation", "geometry_type": kind, "rings": _geometry(element)}]


def _feature(obj: Any) -> dict[str, Any]:
    _need(isinstance(obj, dict) and obj.get("type") == "Feature", "a feature is not a Feature object")
    if "id" in obj:
        _need(isinstance(obj["id"], str), "'id' is not a string")
    geometry = obj.get("geometry")
    _need(isinstance(geometry, dict), "a feature without a geometry object")
    out: dict[str, Any] = {"geometry_type": geometry.get("type"), "rings": _geometry(geometry)}
    props = obj.get("properties", {})
    _need(isinstance(props, dict), "'properties' is not an object")
    kind = props.get("objectType", props.get("object_type", props.get("type", "unknown")))
    _need(isinstance(kind, str), "objectType is not a string")
    _need(
        kind in OBJECT_TYPES or kind == "unknown",
        f"objectType {kind!r} unknown to QuPath (made an annotation)",
    )
    out["objectType"] = "annotation" if kind == "unknown" else kind
    if "name" in props:
        _need(isinstance(props["name"], str), "'name' is not a string")
        out["name"] = props["name"]
    if "color" in props:
        color = props["color"]
        _need(
            isinstance(color, int)
            or (isinstance(color, list) and len(color) == 3 and all(isinstance(c, int) for c in color)),
            "bad 'color'",
        )
    out["classification"] = _classification(props.get("classification"))
    if "isLocked" in props:
        _need(isinstance(props["isLocked"], bool), "'isLocked' is not a boolean")
    out["measurements"] = _measurements(props.get("measurements"))
    if "metadata" in props:
        _need(isinstance(props["metadata"], dict), "'metadata' is not an object")
        _need(
            all(isinstance(v, str | int | float | bool) for v in props["metadata"].values()),
            "metadata values must be primitives",
        )
    return out


def _classification(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        names = [n.strip() for n in value.split(":")]
    else:
        _need(isinstance(value, dict), "classification is neither a string nor an object")
        if not value or "colorRGB" in value or "parentClass" in value:
            return str(value.get("name"))
        _need(
            ("name" in value or "names" in value) and "color" in value,
            "classification object needs name(s) AND color",
        )
        color = value["color"]
        _need(
            isinstance(color, list)
            and len(color) in (3, 4)
            and all(isinstance(c, int) and 0 <= c <= 255 for c in color),
            "classification color is not [r, g, b]",
        )
        names = (
            [value["name"]]
            if "name" in value and value["name"] is not None
            else list(value.get("names") or [])
        )
    for name in names:
        _need(isinstance(name, str) and bool(name.strip()), "blank class name")
        _need(not any(c in name for c in (":", "\n", "\r")), f"class name {name!r} holds ':' or a line break")
    return ":".join(names)


def _measurements(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    out: dict[str, float] = {}
    if isinstance(value, list):
        for item in value:
            _need(isinstance(item, dict) and isinstance(item.get("name"), str), "measurement without a name")
            _need(isinstance(item.get("value"), int | float), "measurement value is not a number")
            out[item["name"]] = float(item["value"])
        return out
    _need(isinstance(value, dict), "measurements neither an array nor an object")
    for key, v in value.items():
        if isinstance(v, bool):
            raise QuPathWouldFail(f"measurement {key!r} is a boolean (dropped by QuPath)")
        if isinstance(v, int | float):
            out[key] = float(v)
        elif isinstance(v, str):
            special = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
            if v.lower() in special:
                out[key] = special[v.lower()]
            elif _JAVA_DOUBLE.match(v.strip()):  # Double.parseDouble
                out[key] = float(v.strip())
            else:
                _fail(key, v)
        else:
            _fail(key, v)
    return out


def _fail(key: str, value: Any) -> None:
    raise QuPathWouldFail(f"measurement {key!r} = {value!r} is not a number QuPath reads")


def _geometry(geometry: dict[str, Any]) -> list[list[list[float]]]:
    kind = geometry.get("type")
    _need(kind in GEOMETRY_TYPES, f"geometry type {kind!r} unknown")
    if kind == "GeometryCollection":
        _need(isinstance(geometry.get("geometries"), list), "GeometryCollection without 'geometries'")
        return [r for g in geometry["geometries"] for r in _geometry(g)]
    coords = geometry.get("coordinates")
    _need(isinstance(coords, list), "geometry without 'coordinates' (IllegalArgumentException)")
    polygons = {"Polygon": [coords], "MultiPolygon": coords}.get(str(kind))
    if polygons is None:
        return []
    rings = []
    for poly in polygons:
        for ring in poly:
            _need(
                all(
                    isinstance(p, list)
                    and len(p) in (2, 3)
                    and all(
                        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in p
                    )
                    for p in ring
                ),
                "a point is not [x, y] numbers",
            )
            _need(len(ring) == 0 or len(ring) >= 4, "LinearRing with 1-3 points (JTS refuses)")
            _need(len(ring) == 0 or ring[0] == ring[-1], "LinearRing not closed (JTS refuses)")
            rings.append(ring)
    return rings

"""QuPath GeoJSON out: FeatureCollections of polygons in level-0 pixels that QuPath's "Import objects"
(File > Import objects, or drag and drop) opens as annotations, detections or tiles.

What QuPath's reader requires (qupath/qupath at e7662d89ec70, qupath-core/src/main/java/qupath/lib/io/;
checked by tests/helpers/qupath_rules.py): a "FeatureCollection" of features (other top-level members
ignored); Polygon / MultiPolygon rings of [x, y] full-resolution pixels, closed; "properties" with
"objectType", "name", "color" [r, g, b], "classification", "measurements", "metadata". An "id" is kept
only when it parses as a UUID, so we write none. A classification object needs "name" (or "names") AND
"color": one without a colour fails the whole import (GsonTools.PathClassTypeAdapter.read).
Measurements are an object {name: number}, the layout QuPath writes since v0.4.0.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np

from wsi.core.files import write_text_atomic

RGB = tuple[int, int, int]
Ring = list[list[float]]  # closed ring of [x, y], level-0 px


class ClassificationJson(TypedDict):
    name: str
    color: list[int]  # [r, g, b]


class PolygonGeometry(TypedDict):
    type: Literal["Polygon"]
    coordinates: list[Ring]  # shell, holes


class MultiPolygonGeometry(TypedDict):
    type: Literal["MultiPolygon"]
    coordinates: list[list[Ring]]


Geometry = PolygonGeometry | MultiPolygonGeometry


class FeatureProperties(TypedDict):
    """The members of a Feature's "properties" that QuPath's PathObjectTypeAdapter reads."""

    objectType: str
    name: NotRequired[str]
    classification: NotRequired[ClassificationJson]
    measurements: NotRequired[dict[str, float | str]]  # "NaN" / "Infinity" / "-Infinity" as strings
    metadata: NotRequired[dict[str, str]]


class Feature(TypedDict):
    type: Literal["Feature"]
    geometry: Geometry
    properties: FeatureProperties
#: QuPath's object types that our files use (QuPathTypeAdapters.MAP_TYPES)
OBJECT_TYPES = ("annotation", "detection", "tile")
#: colours for names without one of their own, picked by a stable hash of the name
_PALETTE: tuple[RGB, ...] = (
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
)  # fmt: skip


@dataclass(frozen=True)
class QuPathClass:
    """A QuPath classification: its name (checked and made legal by `class_name`) and colour."""

    name: str
    color: RGB

    @classmethod
    def of(cls, name: str, color: RGB | None = None) -> QuPathClass:
        legal = class_name(name)
        return cls(legal, color if color is not None else palette_color(legal))

    def to_json(self) -> ClassificationJson:
        return {"name": self.name, "color": [int(c) for c in self.color]}


def class_name(text: str) -> str:
    """`text` as a legal QuPath class name: ":" (PathClass.DELIMITER) becomes "-", line breaks spaces
    (PathClass refuses names holding its delimiter, a line break or nothing but spaces)."""
    name = " ".join(str(text).replace(":", "-").split())
    if not name:
        raise ValueError(f"{text!r} cannot be a QuPath class name: it is blank")
    return name


def palette_color(name: str) -> RGB:
    """A colour that stays the same for a name across files and runs."""
    return _PALETTE[zlib.crc32(name.encode("utf-8")) % len(_PALETTE)]


def measurement_value(value: float) -> float | str:
    """A measurement as QuPath writes it: a number, or "NaN" / "Infinity" / "-Infinity" (JSON has no NaN;
    QuPathTypeAdapters.MeasurementListTypeAdapter reads these strings)."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def box_ring(x: float, y: float, w: float, h: float) -> list[list[float]]:
    """A closed rectangle ring, clockwise on screen (y down), starting at the top-left corner."""
    return [[x, y], [x + w, y], [x + w, y + h], [x, y + h], [x, y]]


def polygon_geometry(polygons: Sequence[Sequence[np.ndarray | Sequence[Sequence[float]]]]) -> Geometry:
    """A Polygon (one) or MultiPolygon (several) of polygons given as [shell, hole, ...] rings of [x, y]."""
    if not polygons:
        raise ValueError("a polygon geometry needs at least one polygon")
    rings = [[[_coord(p) for p in ring] for ring in poly] for poly in polygons]
    if len(rings) == 1:
        return {"type": "Polygon", "coordinates": rings[0]}
    return {"type": "MultiPolygon", "coordinates": rings}


def _coord(point: Sequence[float]) -> list[float]:
    return [round(float(point[0]), 2), round(float(point[1]), 2)]  # QuPath writes 2 decimals too


def feature(
    geometry: Geometry,
    *,
    object_type: str,
    classification: QuPathClass | None = None,
    name: str | None = None,
    measurements: Mapping[str, float] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Feature:
    """One GeoJSON Feature the way QuPath's PathObjectTypeAdapter reads it."""
    if object_type not in OBJECT_TYPES:
        raise ValueError(f"object_type must be one of {', '.join(OBJECT_TYPES)}, got {object_type!r}")
    props: FeatureProperties = {"objectType": object_type}
    if name is not None:
        props["name"] = str(name)
    if classification is not None:
        props["classification"] = classification.to_json()
    if measurements:
        props["measurements"] = {str(k): measurement_value(v) for k, v in measurements.items()}
    if metadata:
        props["metadata"] = {str(k): str(v) for k, v in metadata.items()}
    return {"type": "Feature", "geometry": geometry.copy(), "properties": props}


def tile_features(
    coords_px: np.ndarray,
    size_px: float,
    *,
    object_type: str = "tile",
    classes: Sequence[QuPathClass | None] | None = None,
    measurements: Mapping[str, np.ndarray] | None = None,
) -> list[Feature]:
    """One square Feature per tile: coords_px (N, 2) level-0 top-left (x, y), side `size_px` level-0 px;
    classes (N,) and measurements {name: (N,)} per tile. Built column-wise (100,000 tiles in about a
    second): the same Features as `feature()` gives one by one."""
    if object_type not in OBJECT_TYPES:
        raise ValueError(f"object_type must be one of {', '.join(OBJECT_TYPES)}, got {object_type!r}")
    coords = np.asarray(coords_px, dtype=np.float64).reshape(-1, 2)
    n = len(coords)
    if classes is not None and len(classes) != n:
        raise ValueError(f"{len(classes)} classifications for {n} tiles")
    columns: dict[str, list[float | str]] = {}
    for key, values in (measurements or {}).items():
        column = np.asarray(values, dtype=np.float64).reshape(-1)
        if len(column) != n:
            raise ValueError(f"measurement {key!r} has {len(column)} values for {n} tiles")
        finite = bool(np.isfinite(column).all())
        columns[str(key)] = list(column.tolist()) if finite else [measurement_value(v) for v in column]
    corners = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]], dtype=np.float64) * float(size_px)
    rings = (coords[:, None, :] + corners[None]).round(2).tolist()  # (N, 5, 2): closed squares
    class_json = {id(c): c.to_json() for c in classes or () if c is not None}  # shared: one per class
    out: list[Feature] = []
    for i in range(n):
        props: FeatureProperties = {"objectType": object_type}
        cls = classes[i] if classes is not None else None
        if cls is not None:
            props["classification"] = class_json[id(cls)]
        if columns:
            props["measurements"] = {k: v[i] for k, v in columns.items()}
        out.append(
            {
                "type": "Feature",
                "geometry": {"type": "Polygon", "coordinates": [rings[i]]},
                "properties": props,
            }
        )
    return out


def feature_collection(
    features: Sequence[Feature], properties: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A FeatureCollection; `properties` ride along as a foreign member (QuPath ignores it)."""
    collection: dict[str, Any] = {"type": "FeatureCollection", "features": list(features)}
    if properties:
        collection["properties"] = dict(properties)
    return collection


def write_geojson(path: str | os.PathLike[str], collection: Mapping[str, Any]) -> None:
    """Write atomically as compact UTF-8 JSON; refuses NaN (JSON has none: use `measurement_value`)."""
    text = json.dumps(collection, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    write_text_atomic(path, text + "\n")


def ranked_tiles(
    coords_px: np.ndarray, size_px: float, order: np.ndarray, values: np.ndarray, *, label: str,
    cls: QuPathClass, column: str,
) -> list[Feature]:
    """An annotation per tile of `order` (best first), named `<label> #<rank>`, with its value under
    `column` and its rank as measurements: the tiles a reader should look at first, as QuPath lists them."""
    out: list[Feature] = []
    for rank, i in enumerate(order, start=1):
        x, y = (float(v) for v in coords_px[int(i)])
        out.append(
            feature(
                polygon_geometry([[box_ring(x, y, size_px, size_px)]]), object_type="annotation",
                classification=cls, name=f"{label} #{rank}",
                measurements={column: float(values[int(i)]), "rank": rank},
            )
        )  # fmt: skip
    return out

__all__ = [
    "OBJECT_TYPES",
    "RGB",
    "ClassificationJson",
    "Feature",
    "FeatureProperties",
    "Geometry",
    "MultiPolygonGeometry",
    "PolygonGeometry",
    "QuPathClass",
    "Ring",
    "box_ring",
    "class_name",
    "feature",
    "feature_collection",
    "measurement_value",
    "palette_color",
    "polygon_geometry",
    "ranked_tiles",
    "tile_features",
    "write_geojson",
]

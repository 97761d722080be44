"""QuPath GeoJSON in: a reviewed qc/<slide_id>.geojson (`wsi tile --review`), as tile boxes with the
reviewer's classes and the regions the reviewer excluded.

What QuPath writes when a user opens our qc/<slide_id>.geojson, re-classes tiles or draws annotations and
uses File > Export objects as GeoJSON, read in qupath/qupath at e7662d89ec70 (qupath-gui-fx/.../commands/
ExportObjectsCommand.java, qupath-core/src/main/java/qupath/lib/io/):
- PathIO.exportObjectsAsGeoJSON: a FeatureCollection (the dialog's default), else a bare Feature (one
  object) or a JSON array of Features; "All objects" or only "Selected objects", flat (children are not
  nested: FeatureCollection.wrap without includeChildren); a name ending ".zip" or ".gz" compresses it
  (`wsi.formats.qupath.read.load_geojson` reads all of these). The collection's other members (our
  "properties" with the slide id) are not written back.
- QuPathTypeAdapters.PathObjectTypeAdapter.write: "id" (the object's UUID, since v0.4.0), "geometry",
  "properties" with "objectType" ("tile" for our tiles, "annotation" for drawn regions), "name",
  "color", "classification", "isLocked" (only when true), "measurements" (unless excluded), "metadata".
- GsonTools.PathClassTypeAdapter.write: a classification is {"name": ..., "color": [r, g, b(, a)]}, or
  {"names": [...], "color": ...} for a derived class ("A: B").
- ROITypeAdapters.writeGeometry: coordinates with at most 2 decimals (GeneralTools.formatNumber), so an
  integer corner comes back as 512, never 512.0. A square tile is imported as a rectangle ROI
  (GeometryTools.geometryToROI) and written back by JTS's GeometricShapeFactory.createRectangle; we take
  each tile's box from its ring's min and max, whatever corner the ring starts at.

A tile is known by its box (the min and max of its ring), not by its id: the ids are QuPath's own, made
on import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.errors import ReviewError
from wsi.core.files import sha256_file
from wsi.formats.qupath.read import Polygon, features, is_excluded, load_geojson, polygons_of

#: the object types our tiles come back as (detections and cells a user adds in QuPath are not tiles)
_TILE_TYPES = frozenset({"tile", "PathTileObject"})
_ANNOTATION_TYPES = frozenset({"annotation", "unknown", "PathAnnotationObject"})


@dataclass(frozen=True)
class ReviewFile:
    """One review file's tile objects and Exclude regions, in level-0 pixels."""

    path: Path
    sha256: str
    boxes: np.ndarray  # (T, 4) float64 x0, y0, x1, y1 of every tile object
    classes: tuple[str | None, ...]  # its class ("A: B" for a derived class), None: unclassified
    exclude: list[Polygon] = field(default_factory=list)
    #: the slide id our own file names (QuPath's export drops it: None)
    slide_id: str | None = None
    n_ignored: int = 0  # other annotations (the tissue outline, regions not classed Exclude), points, cells


def class_of(classification: Any) -> str | None:
    """A QuPath classification (a string, or {"name"} / {"names"}) as one name, None when unclassified."""
    if isinstance(classification, str):
        return classification.strip() or None
    if isinstance(classification, dict):
        names = classification.get("names") or [classification.get("name")]
        parts = [str(n).strip() for n in names if n is not None and str(n).strip()]
        return ": ".join(parts) or None
    return None


def read_review(path: str | Path) -> ReviewFile:
    """The tiles and Exclude regions of a QuPath export; ReviewError naming the file and the problem."""
    path = Path(path)
    option = "--review"
    data = load_geojson(path, option=option, error=ReviewError)
    boxes: list[tuple[float, float, float, float]] = []
    classes: list[str | None] = []
    exclude: list[Polygon] = []
    ignored = 0
    for i, (geometry, props) in enumerate(features(data, path, option=option, error=ReviewError)):
        where = f"{option} {path}: feature {i}"
        if not isinstance(props, dict):
            raise ReviewError(f"{where}: 'properties' is not an object")
        kind = str(props.get("objectType", props.get("object_type", props.get("type", "annotation"))))
        polygons = polygons_of(geometry, where, ReviewError)
        if kind in _TILE_TYPES and polygons:
            if len(polygons) != 1 or len(polygons[0]) != 1:
                raise ReviewError(f"{where}: a tile object whose geometry is not one square (split?)")
            (x0, y0), (x1, y1) = polygons[0][0].min(0), polygons[0][0].max(0)
            boxes.append((float(x0), float(y0), float(x1), float(y1)))
            classes.append(class_of(props.get("classification")))
        elif kind in _ANNOTATION_TYPES and polygons and is_excluded(props.get("classification")):
            exclude.extend(polygons)
        else:
            ignored += 1
    if not boxes and not exclude:
        raise ReviewError(
            f"{option} {path}: no tile object and no annotation classed Exclude (or Ignore*): nothing to "
            "review; in QuPath, export All objects of the slide's qc/<slide_id>.geojson (File > Export "
            "objects as GeoJSON)"
        )
    top = data.get("properties") if isinstance(data, dict) else None
    slide_id = top.get("slide_id") if isinstance(top, dict) else None
    return ReviewFile(
        path=path,
        sha256=sha256_file(path),
        boxes=np.array(boxes, dtype=np.float64).reshape(-1, 4),
        classes=tuple(classes),
        exclude=exclude,
        slide_id=str(slide_id) if slide_id is not None else None,
        n_ignored=ignored,
    )


__all__ = ["ReviewFile", "class_of", "read_review"]

"""QuPath GeoJSON in: the annotations of a region-of-interest file, as regions that restrict tiling.

Read as QuPath reads its own exports (qupath/qupath at e7662d89ec70, qupath-core/src/main/java/qupath/
lib/io/): a FeatureCollection, one Feature, a list of Features or a bare geometry
(GsonTools.addPathObjects); the object type from properties "objectType" (or "object_type", "type";
missing = annotation, QuPathTypeAdapters.parseObject). Only annotations count: detections, cells, tiles,
points and lines are skipped. Excluded classes (`is_excluded`) remove tissue; every other annotation,
unclassified ones included, is a region to tile, and a file of excluded regions only tiles the whole
slide outside them. A tile is inside when its centre is inside an included region and outside every
excluded one (even-odd over each polygon's rings: holes are outside; a MultiPolygon is the union).
"""

from __future__ import annotations

import io
import math
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.errors import RoiError, WsiError
from wsi.core.files import is_regular_file, sha256_file
from wsi.core.user_text import MAX_JSON_BYTES, parse_json

Polygon = list[np.ndarray]  # [shell, hole, ...], each (K, 2) float64 level-0 (x, y), closed
_ANNOTATION_TYPES = frozenset({"annotation", "unknown", "PathAnnotationObject"})
_EXCLUDE_NAMES = frozenset({"exclude", "excluded"})
_HOW = "export the annotations from QuPath with File > Export objects as GeoJSON (level-0 pixels)"


@dataclass(frozen=True)
class Roi:
    """The regions of one ROI file, in level-0 pixels."""

    path: Path
    sha256: str
    include: list[Polygon] = field(default_factory=list)  # empty: the whole slide
    exclude: list[Polygon] = field(default_factory=list)
    #: features not used: other object types, points, lines (counted for the log)
    n_skipped: int = 0

    def contains(self, points: np.ndarray) -> np.ndarray:
        """(N,) bool: (N, 2) level-0 (x, y) inside an included region and outside every excluded one."""
        pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        inside = inside_any(self.include, pts) if self.include else np.ones(len(pts), dtype=bool)
        if self.exclude:
            inside &= ~inside_any(self.exclude, pts)
        return inside

    def bounds(self) -> tuple[float, float, float, float] | None:
        """(x_min, y_min, x_max, y_max) of the included regions, None when the whole slide is."""
        if not self.include:
            return None
        shells = np.concatenate([poly[0] for poly in self.include])
        return (*(float(v) for v in shells.min(0)), *(float(v) for v in shells.max(0)))  # type: ignore[return-value]

    def describe(self) -> str:
        return f"{len(self.include)} included and {len(self.exclude)} excluded region(s) from {self.path}"


def inside_any(polygons: list[Polygon], pts: np.ndarray) -> np.ndarray:
    """(N,) bool: each of the (N, 2) points inside one of the polygons (even-odd over its rings)."""
    from matplotlib.path import Path as MplPath  # only with --roi or a review: a plain tile run stays light

    inside = np.zeros(len(pts), dtype=bool)
    for poly in polygons:
        lo, hi = poly[0].min(0), poly[0].max(0)  # only points in the shell's box can be inside
        near = np.flatnonzero(((pts >= lo) & (pts <= hi)).all(1) & ~inside)
        odd = np.zeros(len(near), dtype=bool)
        for ring in poly:  # even-odd over the rings: a point in a hole is in the shell and the hole
            odd ^= MplPath(ring, closed=True).contains_points(pts[near])
        inside[near[odd]] = True
    return inside


def roi_file_for(roi: Path, slide_id: str) -> Path:
    """The ROI file of a slide: `roi` itself, or `<roi>/<slide_id>.geojson` when `roi` is a folder.

    A folder without the slide's file is an error for that slide (RoiError): tiling the whole slide
    instead would silently ignore an annotation that was meant for it (a misspelt name, say)."""
    if not roi.is_dir():
        if not is_regular_file(roi, "--roi"):  # a pipe or device: InputFileError naming it
            raise RoiError(f"--roi {roi} does not exist; give a QuPath GeoJSON file or a folder of them")
        return roi
    found = roi / f"{slide_id}.geojson"
    if not is_regular_file(found, "--roi file"):
        raise RoiError(
            f"--roi {roi}: no {found.name} for slide {slide_id}; add it ({_HOW}), or tile this slide "
            "in a run without --roi"
        )
    return found


def read_roi(path: str | Path) -> Roi:
    """The included and excluded regions of a QuPath GeoJSON file; RoiError naming the file and the
    problem when it is not JSON, not GeoJSON, or holds no polygon annotation."""
    path = Path(path)
    data = load_geojson(path)
    include: list[Polygon] = []
    exclude: list[Polygon] = []
    skipped = 0
    for i, (geometry, props) in enumerate(features(data, path)):
        where = f"--roi {path}: feature {i}"
        if not isinstance(props, dict):
            raise RoiError(f"{where}: 'properties' is not an object")
        kind = props.get("objectType", props.get("object_type", props.get("type", "annotation")))
        polygons = _polygons(geometry, where)
        if str(kind) not in _ANNOTATION_TYPES or not polygons:
            skipped += 1
            continue
        (exclude if is_excluded(props.get("classification")) else include).extend(polygons)
    if not include and not exclude:
        raise RoiError(
            f"--roi {path}: no polygon annotation found (detections, points and lines do not count)"
        )
    return Roi(path, sha256_file(path), include, exclude, skipped)


def is_excluded(classification: Any) -> bool:
    """True for a QuPath class whose region is left out of tiling: an ignored class
    (PathClassTools.isIgnoredClass: the last part of a derived class ends with "*", e.g. "Ignore*")
    except "Region*" (QuPath's class for a region to analyse), or one named "Exclude" / "Excluded" (any
    case). The classification is a string ("A: B", PathClass.DELIMITER ":") or {"name"} / {"names"}."""
    if isinstance(classification, str):
        names = [n.strip() for n in classification.split(":")]
    elif isinstance(classification, dict):
        names = classification.get("names") or [classification.get("name")]
        names = [str(n).strip() for n in names if n is not None]
    else:
        return False
    if not names or not names[-1]:
        return False
    last = names[-1]
    return last.lower() in _EXCLUDE_NAMES or (last.endswith("*") and last != "Region*")


def load_geojson(path: Path, *, option: str = "--roi", error: type[WsiError] = RoiError) -> Any:
    """The JSON of a GeoJSON file, plain or compressed as QuPath's export writes it (PathIO.
    exportObjectsAsGeoJSON: a name ending .zip holds one <name>.geojson entry, .gz is gzip); `error`
    (naming `option` and the file) when it cannot be read, is larger than MAX_JSON_BYTES once unpacked,
    or is not JSON (every parser failure, a 200,000-deep nesting and NaN included)."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise error(f"{option} {path} is {path.stat().st_size} bytes; at most {MAX_JSON_BYTES} are read")
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            unpack = zlib.decompressobj(wbits=31)  # gzip; bounded: a small file may unpack to gigabytes
            raw = unpack.decompress(raw, MAX_JSON_BYTES + 1)
        elif raw[:4] == b"PK\x03\x04":
            with zipfile.ZipFile(io.BytesIO(raw)) as archive:
                names = [n for n in archive.namelist() if not n.endswith("/")]
                if len(names) != 1:
                    raise error(f"{option} {path}: a zip of {len(names)} files; QuPath's export holds one")
                if archive.getinfo(names[0]).file_size > MAX_JSON_BYTES:
                    raise error(f"{option} {path}: its GeoJSON unpacks to more than {MAX_JSON_BYTES} bytes")
                raw = archive.read(names[0])
        if len(raw) > MAX_JSON_BYTES:
            raise error(f"{option} {path}: its GeoJSON unpacks to more than {MAX_JSON_BYTES} bytes")
        text = raw.decode("utf-8")
    except OSError as exc:
        raise error(f"{option} {path}: cannot be read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, zipfile.BadZipFile, EOFError, zlib.error):
        raise error(f"{option} {path}: not a text (GeoJSON) file; {_HOW}") from None
    try:
        return parse_json(text, f"{option} {path}", error=error, finite=True)
    except error as exc:
        raise error(f"{exc}; {_HOW}") from None


def features(
    data: Any, path: Path, *, option: str = "--roi", error: type[WsiError] = RoiError
) -> Iterator[tuple[Any, Any]]:
    """(geometry, properties) of every feature, as GsonTools.addPathObjects walks them."""
    if isinstance(data, list):
        for item in data:
            yield from features(item, path, option=option, error=error)
        return
    if not isinstance(data, dict) or "type" not in data:
        raise error(f"{option} {path}: not GeoJSON (no 'type'); {_HOW}")
    kind = data["type"]
    if kind == "FeatureCollection":
        items = data.get("features")
        if not isinstance(items, list):
            raise error(f"{option} {path}: a FeatureCollection without a 'features' list")
        for item in items:
            yield from features(item, path, option=option, error=error)
    elif kind == "Feature":
        yield data.get("geometry"), data.get("properties") or {}
    else:  # a bare geometry: QuPath makes an annotation of it
        yield data, {}


def polygons_of(geometry: Any, where: str, error: type[WsiError] = RoiError) -> list[Polygon]:
    """The polygons of a geometry (GeometryCollection members included); [] for points and lines;
    `error` starting with `where` for a malformed one."""
    try:
        return _polygons(geometry, where)
    except RoiError as exc:
        if error is RoiError:
            raise
        raise error(str(exc)) from None


def _polygons(geometry: Any, where: str) -> list[Polygon]:
    if geometry is None:
        return []
    if not isinstance(geometry, dict) or "type" not in geometry:
        raise RoiError(f"{where}: 'geometry' is not a GeoJSON geometry")
    kind = geometry["type"]
    if kind == "GeometryCollection":
        return [p for g in geometry.get("geometries") or [] for p in _polygons(g, where)]
    if kind not in ("Polygon", "MultiPolygon"):
        return []
    coords = geometry.get("coordinates")
    if not isinstance(coords, list):
        raise RoiError(f"{where}: a {kind} without a 'coordinates' list")
    parts = coords if kind == "MultiPolygon" else [coords]
    return [poly for part in parts if (poly := _polygon(part, where))]


def _polygon(rings: Any, where: str) -> Polygon:
    if not isinstance(rings, list):
        raise RoiError(f"{where}: a polygon is not a list of rings")
    out = []
    for ring in rings:
        try:
            xy = np.array([[float(p[0]), float(p[1])] for p in ring], dtype=np.float64)
        except (TypeError, ValueError, IndexError):
            raise RoiError(f"{where}: a ring's points are not [x, y] numbers") from None
        if not all(math.isfinite(v) for v in xy.ravel()):
            raise RoiError(f"{where}: a ring has a coordinate that is not a finite number")
        if len(xy) and not np.array_equal(xy[0], xy[-1]):
            xy = np.vstack([xy, xy[:1]])  # GeoJSON rings are closed; close a loose one rather than fail
        if len(xy) < 4:
            raise RoiError(f"{where}: a ring has fewer than 3 distinct points")
        out.append(xy)
    return out


__all__ = [
    "Polygon", "Roi", "features", "inside_any", "is_excluded", "load_geojson", "polygons_of", "read_roi",
    "roi_file_for",
]  # fmt: skip

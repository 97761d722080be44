"""wsi.formats.qupath: the GeoJSON we write passes QuPath's reader rules (tests/helpers/qupath_rules.py,
written from QuPath's own code), masks become polygons with holes, and ROI files read as QuPath means them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from qupath_rules import QuPathWouldFail, parse, parse_file

from wsi.core.errors import RoiError
from wsi.formats.qupath import (
    QuPathClass,
    feature,
    feature_collection,
    is_excluded,
    mask_polygons,
    polygon_geometry,
    read_roi,
    roi_file_for,
    tile_features,
    write_geojson,
)


def _square(x: float, y: float, s: float) -> list[list[float]]:
    return [[x, y], [x + s, y], [x + s, y + s], [x, y + s], [x, y]]


def test_written_tiles_and_annotations_import_with_their_classes_and_measurements(tmp_path: Path) -> None:
    coords = np.array([[0, 0], [512, 0], [1024, 512]])
    classes = [QuPathClass.of("kept", (0, 170, 0)), QuPathClass.of("ink: green"), None]
    tiles = tile_features(
        coords, 512.0, classes=classes, measurements={"score": np.array([0.5, math.nan, -math.inf])}
    )
    outline = feature(
        polygon_geometry([[_square(0, 0, 2000), _square(100, 100, 50)], [_square(3000, 0, 10)]]),
        object_type="annotation",
        classification=QuPathClass.of("Tissue"),
        name="slide tissue",
        metadata={"source": "wsi"},
    )
    path = tmp_path / "s.geojson"
    write_geojson(path, feature_collection([outline, *tiles], {"slide_id": "s"}))
    objects = parse_file(path)
    assert [o["objectType"] for o in objects] == ["annotation", "tile", "tile", "tile"]
    assert objects[0]["geometry_type"] == "MultiPolygon" and len(objects[0]["rings"]) == 3  # hole kept
    assert [o["classification"] for o in objects[1:]] == [
        "kept",
        "ink- green",
        None,
    ]  # ':' is QuPath's delimiter
    assert objects[1]["rings"] == [_square(0, 0, 512)]
    assert objects[1]["measurements"] == {"score": 0.5}
    assert math.isnan(objects[2]["measurements"]["score"])
    assert objects[3]["measurements"]["score"] == -math.inf
    raw = json.loads(path.read_text())
    assert raw["features"][2]["properties"]["measurements"] == {"score": "NaN"}  # QuPath's own spelling
    assert raw["properties"] == {"slide_id": "s"}
    assert raw["features"][1]["properties"]["classification"] == {"name": "kept", "color": [0, 170, 0]}


def test_the_checker_fails_where_quPaths_reader_throws() -> None:
    ring = _square(0, 0, 5)

    def one(props: dict, geometry: dict | None = None) -> None:
        parse(
            {
                "type": "Feature",
                "geometry": geometry or {"type": "Polygon", "coordinates": [ring]},
                "properties": props,
            }
        )

    one({"objectType": "tile", "classification": {"name": "A", "color": [1, 2, 3]}})  # fine
    with pytest.raises(QuPathWouldFail, match=r"name\(s\) AND color"):
        one({"classification": {"name": "A"}})  # PathClassTypeAdapter: JsonParseException
    with pytest.raises(QuPathWouldFail, match="':'"):
        one({"classification": {"name": "a:b", "color": [1, 2, 3]}})
    with pytest.raises(QuPathWouldFail, match="not closed"):
        one({}, {"type": "Polygon", "coordinates": [ring[:-1]]})
    with pytest.raises(QuPathWouldFail, match="coordinates"):
        one({}, {"type": "Polygon"})
    with pytest.raises(QuPathWouldFail, match="not a number"):
        one({"measurements": {"a": "high"}})


def test_writer_refuses_what_quPath_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="object_type"):
        feature({"type": "Polygon", "coordinates": [_square(0, 0, 1)]}, object_type="cell")
    with pytest.raises(ValueError, match="blank"):
        QuPathClass.of(" \n ")
    with pytest.raises(ValueError, match="measurement 'a' has 1 values for 2 tiles"):
        tile_features(np.zeros((2, 2)), 1.0, measurements={"a": np.zeros(1)})
    with pytest.raises(ValueError):  # json refuses NaN: measurements go through measurement_value
        write_geojson(tmp_path / "x.geojson", {"type": "FeatureCollection", "features": [], "v": math.nan})
    assert not (tmp_path / "x.geojson").exists()


def test_mask_outline_has_its_hole_and_its_islands_at_level0_scale() -> None:
    mask = np.zeros((40, 60), dtype=bool)
    mask[5:35, 5:35] = True
    mask[15:25, 15:25] = False  # a hole
    mask[18:22, 18:22] = True  # an island in the hole
    mask[10:20, 45:55] = True  # a separate piece
    polygons = mask_polygons(mask, scale=(4.0, 2.0), tolerance=0)
    assert [len(p) for p in polygons] == [2, 1, 1]  # big piece with its hole, then the smaller ones

    def area(ring: np.ndarray) -> float:
        x, y = ring[:, 0], ring[:, 1]
        return abs(0.5 * float(np.dot(x[:-1], y[1:]) - np.dot(x[1:], y[:-1])))

    big, hole = polygons[0]
    # traced through pixel edges' midpoints: each boundary cuts its corner pixels by half a pixel
    assert area(big) == pytest.approx(30 * 30 * 8, rel=0.01)
    assert area(hole) == pytest.approx(10 * 10 * 8, rel=0.05)
    xs, ys = big[:, 0], big[:, 1]
    assert (xs.min(), xs.max(), ys.min(), ys.max()) == (5 * 4, 35 * 4, 5 * 2, 35 * 2)
    assert mask_polygons(np.zeros((5, 5), bool), scale=(1, 1)) == []


def _roi(tmp_path: Path, features: list, name: str = "roi.geojson") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    return path


def _f(
    coords: list, cls: object = None, kind: str = "Polygon", object_type: str | None = "annotation"
) -> dict:
    props: dict = {} if object_type is None else {"objectType": object_type}
    if cls is not None:
        props["classification"] = cls
    return {"type": "Feature", "geometry": {"type": kind, "coordinates": coords}, "properties": props}


def test_roi_includes_minus_holes_and_excluded_classes(tmp_path: Path) -> None:
    path = _roi(
        tmp_path,
        [
            _f(
                [[_square(0, 0, 100), _square(10, 10, 20)], [[_square(200, 0, 50)]]][0]
            ),  # polygon with a hole
            _f([[_square(200, 0, 50)]], {"name": "Tumor", "color": [200, 0, 0]}, kind="MultiPolygon"),
            _f([_square(60, 60, 30)], {"name": "Ignore*", "color": [180, 180, 180]}),
            _f(
                [_square(300, 300, 30)], "Region*", object_type=None
            ),  # QuPath's region class: a region to tile
            _f([_square(0, 0, 1000)], object_type="detection"),  # detections do not restrict tiling
            {"type": "Feature", "geometry": {"type": "Point", "coordinates": [5, 5]}, "properties": {}},
        ],
    )
    roi = read_roi(path)
    assert (len(roi.include), len(roi.exclude), roi.n_skipped) == (3, 1, 2)
    points = np.array([[5, 5], [20, 20], [70, 70], [95, 50], [225, 25], [310, 310], [500, 500]])
    assert roi.contains(points).tolist() == [True, False, False, True, True, True, False]
    assert roi.bounds() == (0.0, 0.0, 330.0, 330.0)


def test_excluded_classes_follow_quPaths_ignored_classes() -> None:
    assert is_excluded("Ignore*") and is_excluded({"name": "Artefact*", "color": [0, 0, 0]})
    assert is_excluded({"names": ["Tumor", "Exclude"], "color": [1, 1, 1]}) and is_excluded("excluded")
    assert not is_excluded("Region*") and not is_excluded("Tumor") and not is_excluded(None)
    assert not is_excluded("Ignore*: Tumor")  # a derived class is named by its last part (PathClass.getName)


def test_only_excluded_regions_tile_everything_else(tmp_path: Path) -> None:
    roi = read_roi(_roi(tmp_path, [_f([_square(0, 0, 10)], "Exclude")]))
    assert roi.contains(np.array([[5, 5], [50, 50]])).tolist() == [False, True]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"features": []}', "not GeoJSON"),
        (
            '{"type": "FeatureCollection", "features": [{"type": "Feature", "geometry": {"type": "Point", '
            '"coordinates": [1, 2]}}]}',
            "no polygon annotation",
        ),
        ('{"type": "Polygon", "coordinates": [[[0, 0], [1, "a"], [1, 1], [0, 0]]]}', r"not \[x, y\] numbers"),
        ('{"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [0, 0]]]}', "fewer than 3"),
    ],
)
def test_unusable_roi_files_name_the_file_and_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.geojson"
    path.write_text(text)
    with pytest.raises(RoiError, match=message) as info:
        read_roi(path)
    assert str(path) in str(info.value)


def test_roi_folder_gives_each_slide_its_file(tmp_path: Path) -> None:
    path = _roi(tmp_path, [_f([_square(0, 0, 10)])], name="s1.geojson")
    assert roi_file_for(tmp_path, "s1") == path
    assert roi_file_for(path, "anything") == path
    with pytest.raises(RoiError, match=r"no s2.geojson for slide s2"):
        roi_file_for(tmp_path, "s2")

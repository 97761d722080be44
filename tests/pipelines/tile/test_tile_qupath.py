"""`wsi tile` and QuPath: qc/<slide_id>.geojson shows every tissue tile with its fate, and --roi
restricts tiling to annotations (centre rule, holes, excluded classes), per slide, recorded and re-run
when it changes. On generated slides (wsi.synthetic) whose tissue lies at known places."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from qupath_rules import parse_file

from wsi.cli.main import cli
from wsi.core.files import sha256_file
from wsi.formats.qupath import read_roi
from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.scheduling.jobs import read_manifest
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.sources import SlideSource


@pytest.fixture(scope="module")
def scene(make_slide):
    """2 x 2 mm at 0.5 um/px (8 x 8 grid of 512 px cells), two tissue boxes, one blurred box."""
    return make_slide(name="scene", size_um=2048.0, mpp=0.5, seed=2)


@pytest.fixture(scope="module")
def full(scene, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scene tiled without a ROI."""
    out = tmp_path_factory.mktemp("full")
    [result] = tile_slides([SlideSource("scene", scene.path, None)], out_dir=out)
    assert result.status == "ok", result.error
    return out


def _square(x: float, y: float, s: float) -> list[list[float]]:
    return [[x, y], [x + s, y], [x + s, y + s], [x, y + s], [x, y]]


def test_qc_geojson_holds_tissue_outline_and_every_tile_with_its_fate(scene, full: Path) -> None:
    paths = output_paths(full, "scene")
    objects = parse_file(paths.geojson)  # QuPath's reader rules
    tf = read_tile_file(paths.h5)
    [tissue] = [o for o in objects if o["objectType"] == "annotation"]
    assert tissue["classification"] == "Tissue" and tissue["geometry_type"] == "MultiPolygon"
    # the outline follows the two tissue boxes (level-0 px = um / 0.5), within one thumbnail pixel (8 um)
    shells = [np.array(r) for r in tissue["rings"]]
    boxes_px = sorted(tuple(v / scene.mpp for v in box) for box in scene.tissue_boxes_um)
    found = sorted((*s.min(0), *s.max(0)) for s in shells)
    np.testing.assert_allclose(found, boxes_px, atol=8 / scene.mpp + 1)
    tiles = [o for o in objects if o["objectType"] == "tile"]
    m = tf.meta
    c = m.counts
    assert len(tiles) == c.n_tissue
    fates = Counter(o["classification"] for o in tiles)
    assert fates == {
        k: v for k, v in {"kept": c.n_kept, "blurry": c.n_blurry, "background": c.n_background}.items() if v
    }
    kept = sorted(tuple(o["rings"][0][0]) for o in tiles if o["classification"] == "kept")
    assert kept == sorted(tuple(float(v) for v in xy) for xy in tf.coords)  # top-left corners, level-0 px
    assert all(0.25 <= o["measurements"]["Tissue fraction"] <= 1 for o in tiles)
    props = json.loads(paths.geojson.read_text())["properties"]
    assert props["slide_id"] == "scene" and props["tiles"]["kept"] == c.n_kept


def _centre_inside(xy: np.ndarray, step: float, box: tuple[float, float, float, float]) -> np.ndarray:
    c = xy + step / 2
    return (c[:, 0] >= box[0]) & (c[:, 0] <= box[2]) & (c[:, 1] >= box[1]) & (c[:, 1] <= box[3])


def test_roi_keeps_exactly_the_tiles_whose_centre_is_inside(scene, full: Path, tmp_path: Path) -> None:
    step = 512.0
    # include: the left half with a hole over cells (col, row) (1, 1)-(1, 2); exclude: cell (2, 3) as Ignore*
    include = [
        [[0, 0], [2048, 0], [2048, 4096], [0, 4096], [0, 0]],
        [[600, 600], [1000, 600], [1000, 1400], [600, 1400], [600, 600]],
    ]
    roi_path = tmp_path / "scene.geojson"
    tumor = {"objectType": "annotation", "classification": {"name": "Tumor", "color": [200, 0, 0]}}
    ignore = {"objectType": "annotation", "classification": "Ignore*"}
    features = [
        {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": include}, "properties": tumor},
        {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [_square(1040, 1550, 480)]},
         "properties": ignore},
    ]  # fmt: skip
    roi_path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    [result] = tile_slides([SlideSource("scene", scene.path, None)], out_dir=tmp_path / "out", roi=roi_path)
    assert result.status == "ok", result.error
    before = read_tile_file(output_paths(full, "scene").h5).coords.astype(float)
    after = read_tile_file(output_paths(tmp_path / "out", "scene").h5)
    left = _centre_inside(before, step, (0, 0, 2048, 4096))
    hole = _centre_inside(before, step, (600, 600, 1000, 1400))
    ignored = _centre_inside(before, step, (1040, 1550, 1520, 2030))
    expected = before[left & ~hole & ~ignored]
    assert hole.any() and ignored.any() and (~left).any()  # each rule removes some kept tile here
    assert sorted(map(tuple, after.coords.tolist())) == sorted(map(tuple, expected.astype(int).tolist()))
    assert after.meta.roi.sha256 == sha256_file(roi_path)
    assert after.meta.roi.n_outside > 0 and after.meta.roi.path == str(roi_path.absolute())
    # the QC GeoJSON shows only the tiles tiled (inside the ROI)
    tiles = [
        o for o in parse_file(output_paths(tmp_path / "out", "scene").geojson) if o["objectType"] == "tile"
    ]
    assert len(tiles) == after.meta.counts.n_tissue
    assert read_roi(roi_path).contains(np.array([r["rings"][0][0] for r in tiles]) + step / 2).all()

    # re-run: same ROI skipped; a changed ROI re-tiles
    [again] = tile_slides([SlideSource("scene", scene.path, None)], out_dir=tmp_path / "out", roi=roi_path)
    assert again.status == "skipped"
    roi_path.write_text(json.dumps({"type": "Polygon", "coordinates": [_square(0, 0, 4096)]}))
    [changed] = tile_slides([SlideSource("scene", scene.path, None)], out_dir=tmp_path / "out", roi=roi_path)
    assert changed.status == "ok" and changed.n == len(before)


def test_roi_folder_fails_the_slide_without_a_file_and_a_bad_file_alone(
    scene, sample_slide, tmp_path: Path
) -> None:
    rois = tmp_path / "rois"
    rois.mkdir()
    (rois / "scene.geojson").write_text(json.dumps({"type": "Polygon", "coordinates": [_square(0, 0, 4096)]}))
    sources = [SlideSource("scene", scene.path, None), SlideSource("sample", sample_slide.path, None)]
    results = tile_slides(sources, out_dir=tmp_path / "out", roi=rois)
    assert [r.status for r in results] == ["ok", "failed"]
    assert "no sample.geojson for slide sample" in results[1].error
    (rois / "sample.geojson").write_text("{not json")
    results = tile_slides(sources, out_dir=tmp_path / "out", roi=rois)
    assert [r.status for r in results] == ["skipped", "failed"]
    assert "not valid JSON" in results[1].error and "sample.geojson" in results[1].error


def test_roi_of_another_slide_says_so(scene, tmp_path: Path) -> None:
    roi = tmp_path / "far.geojson"
    roi.write_text(json.dumps({"type": "Polygon", "coordinates": [_square(90000, 90000, 500)]}))
    [result] = tile_slides([SlideSource("scene", scene.path, None)], out_dir=tmp_path / "out", roi=roi)
    assert result.status == "empty"
    assert "inside the ROI" in result.error and "this slide's QuPath export" in result.error


def test_cli_roi_option(scene, tmp_path: Path) -> None:
    bad = tmp_path / "bad.geojson"
    bad.write_text('{"type": "FeatureCollection", "features": []}')
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["tile", str(scene.path), "--out", str(out), "--roi", str(bad)])
    assert res.exit_code == 1, res.output
    [row] = read_manifest(out / "tiles" / "manifest.csv")
    assert row.status == "failed" and "no polygon annotation" in row.error
    assert "Traceback" not in res.output
    help_text = CliRunner().invoke(cli, ["tile", "--help"]).output
    assert "--roi" in help_text and "qc/<slide_id>.geojson" in help_text

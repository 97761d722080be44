"""`wsi tile --review`: qc/<slide_id>.geojson opened in QuPath, tiles re-classed and an Ignore* region
drawn, exported with File > Export objects as GeoJSON and passed back gives exactly that tile set, from
the tile file without reading the slide; a changed tile set re-makes the bags; a file that does not fit
the slide fails that slide with a message naming the file. On a generated slide (wsi.synthetic)."""

from __future__ import annotations

import copy
import gzip
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from qupath_export import fates, qupath_export
from qupath_rules import parse

from wsi.cli.main import cli
from wsi.core.errors import ConfigError, ReviewError
from wsi.core.files import sha256_file
from wsi.formats.qupath import ReviewFile, read_review
from wsi.formats.tile_file import open_tile_pixels, read_candidates, read_tile_file, write_tile_file
from wsi.pipelines.embed import EmbedOptions, embed_tiles
from wsi.pipelines.scheduling.jobs import read_manifest
from wsi.pipelines.tile.review import apply_review
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.slide import Slide, open_slide
from wsi.slides.sources import SlideSource
from wsi.tiling.grid import BLURRY, KEPT, UNREADABLE

STEP = 512.0  # 256 um tiles at 0.5 um/px, level-0 px


@pytest.fixture(scope="module")
def scene(make_slide):
    """2 x 2 mm at 0.5 um/px: two tissue boxes, one blurred box (kept and blurry tiles)."""
    return make_slide(name="scene", size_um=2048.0, mpp=0.5, seed=2)


def _src(scene, slide_id: str = "scene") -> list[SlideSource]:
    return [SlideSource(slide_id, scene.path, None)]


def _coords(path: Path) -> set[tuple[int, int]]:
    return {(int(x), int(y)) for x, y in read_tile_file(path).coords}


def _write(path: Path, collection: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(collection, indent=2))  # QuPath's "Pretty JSON"
    return path


@pytest.fixture
def no_slide_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a slide fails the test."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("the slide was opened during a review")

    monkeypatch.setattr(Slide, "__init__", refuse)


@pytest.fixture(scope="module")
def tiled(scene, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The scene tiled once (copied per test) and its qc GeoJSON."""
    out = tmp_path_factory.mktemp("tiled")
    [row] = tile_slides(_src(scene), out_dir=out)
    assert row.status == "ok", row.error
    return out, json.loads(output_paths(out, "scene").geojson.read_text())


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _review_edits(qc: dict[str, Any]) -> tuple[dict, set, set, set]:
    """Two blurry tiles re-classed kept, one kept tile re-classed ink, an Ignore* rectangle over the
    centres of kept tiles; returns (export, restored, dropped by class, dropped by the region)."""
    fate = fates(qc)
    kept = sorted(fate["kept"])
    restored = set(sorted(fate["blurry"])[:2])
    reclassed = {kept[0]}
    x0, y0 = kept[-1]  # a region holding the centres of the last kept tile (and any other inside it)
    ring = [[x0 + 100, y0 + 100], [x0 + 400.5, y0 + 100], [x0 + 400.5, y0 + 400.25], [x0 + 100, y0 + 400.25]]
    ring.append(ring[0])
    centres = {
        c
        for c in kept
        if x0 + 100 <= c[0] + STEP / 2 <= x0 + 400.5 and y0 + 100 <= c[1] + STEP / 2 <= y0 + 400.25
    }
    classes = {c: "kept" for c in restored} | {c: "ink" for c in reclassed}
    return qupath_export(qc, classes, [(ring, "Ignore*")]), restored, reclassed, centres


def test_review_round_trip_keeps_exactly_the_reviewed_tiles_without_reading_the_slide(
    scene, tiled, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _copy_run(tiled[0], tmp_path / "run")
    first = read_tile_file(output_paths(out, "scene").h5)
    paths = output_paths(out, "scene")
    qc = json.loads(paths.geojson.read_text())
    qc_bytes, png_bytes = paths.geojson.read_bytes(), paths.qc.read_bytes()
    filtered = _coords(paths.h5)
    export, restored, reclassed, in_region = _review_edits(qc)
    assert len(restored) == 2 and in_region and not in_region & reclassed
    assert len(parse(export)) == len(export["features"])  # what QuPath's importer reads (tests/qupath_rules)
    review = _write(tmp_path / "reviewed" / "scene.geojson", export)
    as_list = read_review(
        _write(tmp_path / "list.geojson", export["features"])
    )  # "FeatureCollection" unticked
    plain = read_review(review)
    np.testing.assert_array_equal(as_list.boxes, plain.boxes)
    assert as_list.classes == plain.classes and len(plain.exclude) == 1 and plain.slide_id is None

    with monkeypatch.context() as m:  # nothing may open the slide: the review comes from the tile file
        m.setattr(Slide, "__init__", lambda *a, **k: pytest.fail("the slide was opened during a review"))
        [row] = tile_slides(_src(scene), out_dir=out, review=review.parent)
        assert row.status == "ok", row.error
        expected = (filtered | restored) - reclassed - in_region
        assert _coords(paths.h5) == expected and row.n == len(expected)
        meta = read_tile_file(paths.h5).meta
        assert meta.review is not None and meta.review.sha256 == sha256_file(review)
        assert (meta.review.n_restored, meta.review.n_dropped) == (2, 1 + len(in_region))
        assert meta.review.n_tiles == len(first) + len(fates(qc)["blurry"]) and meta.review.n_regions == 1
        c = meta.counts
        assert (c.n_kept, c.n_excluded, c.n_blurry) == (
            len(expected),
            1 + len(in_region),
            len(fates(qc)["blurry"]) - 2,
        )
        assert (
            f"reviewed (scene.geojson): 2 rejected tile(s) kept, {1 + len(in_region)} kept tile(s) dropped"
            in row.note
        )
        [manifest] = read_manifest(out / "tiles" / "manifest.csv")
        assert manifest.note == row.note
        # the QC files keep the filters' verdicts: the file a reviewer edits stays the same
        assert paths.geojson.read_bytes() == qc_bytes and paths.qc.read_bytes() == png_bytes

        [again] = tile_slides(_src(scene), out_dir=out, review=review.parent)  # same review: a no-op
        assert again.status == "skipped" and _coords(paths.h5) == expected
        [undone] = tile_slides(_src(scene), out_dir=out)  # without --review: the filters' verdicts again
        assert undone.status == "ok" and _coords(paths.h5) == filtered
        assert read_tile_file(paths.h5).meta.review is None

    # a fresh run given the review from the start gives the same tiles; QuPath's .gz export reads too
    gz = tmp_path / "gz" / "scene.geojson.gz"
    gz.parent.mkdir()
    gz.write_bytes(gzip.compress(review.read_bytes()))
    [fresh] = tile_slides(_src(scene), out_dir=tmp_path / "fresh", review=gz.parent)
    assert fresh.status == "ok" and _coords(output_paths(tmp_path / "fresh", "scene").h5) == expected


def test_review_with_saved_pixels_reads_only_the_newly_kept_tiles(
    scene, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    [first] = tile_slides(_src(scene), out_dir=out, save_tiles=True)
    assert first.status == "ok", first.error
    paths = output_paths(out, "scene")
    export, restored, _, _ = _review_edits(json.loads(paths.geojson.read_text()))
    review = _write(tmp_path / "review.geojson", export)
    reads: list[tuple[int, int]] = []
    original = Slide.read_region_um

    def counting(self, x, y, *args, **kwargs):
        reads.append((int(x), int(y)))
        return original(self, x, y, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(Slide, "read_region_um", counting)
        [row] = tile_slides(_src(scene), out_dir=out, save_tiles=True, review=review)
    assert row.status == "ok", row.error
    assert sorted(reads) == sorted(restored)  # only the two tiles the review newly keeps
    tf = read_tile_file(paths.h5)
    pixels = open_tile_pixels(paths.zarr)
    assert pixels.shape[0] == len(tf)
    with open_slide(scene.path) as slide:
        for i in (
            0,
            len(tf) // 2,
            len(tf) - 1,
            *[int(np.flatnonzero((tf.coords == c).all(1))[0]) for c in restored],
        ):
            x, y = tf.coords[i]
            np.testing.assert_array_equal(pixels[i], slide.read_region_um(int(x), int(y), 256.0, 1.0))


def test_a_changed_tile_set_remakes_the_bag(scene, tiled, tmp_path: Path) -> None:
    out = _copy_run(tiled[0], tmp_path / "run")
    first = read_tile_file(output_paths(out, "scene").h5)
    options = EmbedOptions(encoder="timm:test_resnet", random_init=True, input_px=64, batch_size=8, readers=0,
                           dtype="float32", threads=1)  # fmt: skip
    assert [r.status for r in embed_tiles(tiles_dir=out, out_dir=out, options=options, progress=False)] == [
        "ok"
    ]
    bag = out / "features" / "timm-test_resnet" / "scene.h5"
    paths = output_paths(out, "scene")
    fate = fates(json.loads(paths.geojson.read_text()))

    def swap(k: int) -> Path:  # one blurry tile kept, one kept tile dropped: the same number of tiles
        classes = {sorted(fate["blurry"])[k]: "kept", sorted(fate["kept"])[k]: "blurry"}
        return _write(
            tmp_path / f"swap{k}.geojson", qupath_export(json.loads(paths.geojson.read_text()), classes)
        )

    [row] = tile_slides(_src(scene), out_dir=out, review=swap(0))
    assert row.status == "ok" and row.n == len(first)
    [again] = embed_tiles(tiles_dir=out, out_dir=out, options=options, progress=False)
    assert again.status == "ok"  # re-made, though the count is the same
    with h5py.File(bag) as h5:
        assert {tuple(xy) for xy in h5["coords_px"][()].tolist()} == _coords(paths.h5)
    [same] = embed_tiles(tiles_dir=out, out_dir=out, options=options, progress=False)
    assert same.status == "skipped"
    with h5py.File(bag, "a") as h5:  # a bag written before bags recorded their tile set
        del h5.attrs["tiles_sha256"]
    assert embed_tiles(tiles_dir=out, out_dir=out, options=options, progress=False)[0].status == "skipped"
    tile_slides(_src(scene), out_dir=out, review=swap(1))
    assert embed_tiles(tiles_dir=out, out_dir=out, options=options, progress=False)[0].status == "ok"


# ------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("shifted", "not candidate tiles of this slide (first at x="),
        ("smaller", "are not tiles of this run (256 x 256 px; this run's tiles are 512 px a side)"),
        ("twice", "is there twice, classed to keep and to drop"),
        ("empty", "no tile object and no annotation classed Exclude"),
        ("not json", "not valid JSON"),
    ],
)
def test_a_review_that_does_not_fit_fails_the_slide_and_leaves_its_tiles(
    scene, tiled, tmp_path: Path, edit: str, message: str, no_slide_reads: None
) -> None:
    out = _copy_run(tiled[0], tmp_path / "run")
    qc = copy.deepcopy(tiled[1])
    export = qupath_export(qc, {})
    tiles = [f for f in export["features"] if f["properties"]["objectType"] == "tile"]
    if edit == "shifted":
        for f in tiles:
            f["geometry"]["coordinates"] = [[[x + 100, y] for x, y in f["geometry"]["coordinates"][0]]]
    elif edit == "smaller":
        x, y = tiles[0]["geometry"]["coordinates"][0][0]
        tiles[0]["geometry"]["coordinates"] = [
            [[x, y], [x + 256, y], [x + 256, y + 256], [x, y + 256], [x, y]]
        ]
    elif edit == "twice":
        kept = next(f for f in tiles if f["properties"]["classification"]["name"] == "kept")
        dup = copy.deepcopy(kept)
        dup["id"] = str(uuid.uuid4())
        dup["properties"]["classification"] = {"name": "ink", "color": [255, 140, 0]}
        export["features"].append(dup)
    elif edit == "empty":
        export["features"] = [f for f in export["features"] if f["properties"]["objectType"] != "tile"]
    path = _write(tmp_path / "bad.geojson", export)
    if edit == "not json":
        path.write_text("{not json")
    before = output_paths(out, "scene").h5.read_bytes()
    [row] = tile_slides(_src(scene), out_dir=out, review=path)
    assert row.status == "failed" and message in row.error and str(path) in row.error, row.error
    assert output_paths(out, "scene").h5.read_bytes() == before


def test_another_slides_review_is_refused(scene, sample_slide, tiled, tmp_path: Path) -> None:
    review = _write(tmp_path / "scene.geojson", qupath_export(tiled[1], {}))
    [row] = tile_slides(
        [SlideSource("sample", sample_slide.path, None)], out_dir=tmp_path / "o", review=review
    )
    assert (
        row.status == "failed"
        and "not candidate tiles of this slide" in row.error
        and str(review) in row.error
    )
    # our own qc file (not re-exported) names its slide
    ours = tmp_path / "ours" / "other.geojson"
    ours.parent.mkdir()
    ours.write_bytes(output_paths(tiled[0], "scene").geojson.read_bytes())
    [row] = tile_slides(_src(scene, "other"), out_dir=tmp_path / "o2", review=ours.parent)
    assert row.status == "failed" and "the QC file of slide 'scene', not of 'other'" in row.error


def test_review_option_checks(scene, sample_slide, tiled, tmp_path: Path, caplog) -> None:
    out = _copy_run(tiled[0], tmp_path / "run")
    with pytest.raises(ConfigError, match="inside this run's qc/ folder"):
        tile_slides(_src(scene), out_dir=out, review=out / "qc")
    both = [*_src(scene), SlideSource("sample", sample_slide.path, None)]
    single = _write(tmp_path / "one.geojson", qupath_export(tiled[1], {}))
    with pytest.raises(ConfigError, match="one file for 2 slides"):
        tile_slides(both, out_dir=out, review=single)
    folder = tmp_path / "reviews"
    _write(folder / "scene.geojson", qupath_export(tiled[1], {}))
    _write(folder / "scnee.geojson", qupath_export(tiled[1], {}))  # a misspelt id
    with caplog.at_level(logging.WARNING):
        rows = tile_slides(both, out_dir=out, review=folder)
    assert [r.status for r in rows] == ["ok", "ok"]  # scene reviewed (unchanged tiles); sample has no file
    assert "scnee.geojson" in caplog.text and "match no slide" in caplog.text
    assert read_tile_file(output_paths(out, "scene").h5).meta.review is not None
    assert read_tile_file(output_paths(out, "sample").h5).meta.review is None
    # the command: the option, its refusal (exit 2, nothing run) and a review applied
    run = ["tile", str(scene.path), "--out", str(out), "--review"]
    refused = CliRunner().invoke(cli, [*run, str(out / "qc")])
    assert refused.exit_code == 2 and "inside this run's qc/ folder" in refused.output
    edited = qupath_export(tiled[1], {sorted(fates(tiled[1])["kept"])[0]: "Ignore*"})
    done = CliRunner().invoke(cli, [*run, str(_write(tmp_path / "cli" / "scene.geojson", edited))])
    rows = {r.slide_id: r for r in read_manifest(out / "tiles" / "manifest.csv")}
    assert done.exit_code == 0 and "1 kept tile(s) dropped" in rows["scene"].note, done.output
    assert "--review FILE|FOLDER" in CliRunner().invoke(cli, ["tile", "--help"]).output


def test_a_review_dropping_every_tile_leaves_the_slide_empty(scene, tiled, tmp_path: Path) -> None:
    out = _copy_run(tiled[0], tmp_path / "run")
    everything = [[0, 0], [5000, 0], [5000, 5000], [0, 5000], [0, 0]]
    review = _write(tmp_path / "all.geojson", qupath_export(tiled[1], {}, [(everything, "Ignore*")]))
    [row] = tile_slides(_src(scene), out_dir=out, review=review)
    assert row.status == "empty" and "dropped all" in row.error and "run without --review" in row.error
    cands = read_candidates(output_paths(out, "scene").h5)  # the filters' verdicts are still there
    assert cands is not None and (cands.reasons == KEPT).sum() == len(fates(tiled[1])["kept"])
    [back] = tile_slides(_src(scene), out_dir=out)
    assert back.status == "ok" and back.n == len(fates(tiled[1])["kept"])


def test_a_tile_file_without_candidates_is_tiled_again_for_a_review(scene, tiled, tmp_path: Path) -> None:
    out = _copy_run(tiled[0], tmp_path / "run")
    h5 = output_paths(out, "scene").h5
    tf = read_tile_file(h5)
    write_tile_file(h5, coords=tf.coords, coords_um=tf.coords_um, meta=tf.meta)  # as an older version wrote
    assert read_candidates(h5) is None
    reclass = {sorted(fates(tiled[1])["kept"])[0]: "ink"}
    review = _write(tmp_path / "r.geojson", qupath_export(tiled[1], reclass))
    [row] = tile_slides(_src(scene), out_dir=out, review=review)
    assert row.status == "ok" and row.n == len(tf) - 1 and read_candidates(h5) is not None


def test_a_tile_that_could_not_be_decoded_cannot_be_kept(tmp_path: Path) -> None:
    coords = np.array([[0, 0], [512, 0], [1024, 0]])
    reasons = np.array([KEPT, UNREADABLE, BLURRY], np.int8)
    review = ReviewFile(
        path=tmp_path / "r.geojson", sha256="x", classes=("kept", "kept", "kept"),
        boxes=np.array([[x, y, x + STEP, y + STEP] for x, y in coords], np.float64),
    )  # fmt: skip
    with pytest.raises(ReviewError, match="1 tile\\(s\\) whose pixels could not be decoded \\(x=512 y=0\\)"):
        apply_review(reasons, review, coords, STEP)
    ok = ReviewFile(path=review.path, sha256="x", classes=("blurry", None, "kept"), boxes=review.boxes)
    final, record = apply_review(reasons, ok, coords, STEP)
    assert final.tolist() == [15, UNREADABLE, KEPT] and (record.n_restored, record.n_dropped) == (1, 1)

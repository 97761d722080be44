"""The tile stage end to end on generated and real slides: placement, filters, resume, failures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from wsi.formats.tile_file import is_complete, open_tile_pixels, read_tile_file
from wsi.pipelines.scheduling.jobs import read_manifest
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.slide import open_slide
from wsi.slides.sources import SlideSource, find_slides
from wsi.synthetic import write_truncated_copy
from wsi.tiling.params import TileParams
from wsi.tiling.qc_legend import BLURRY_RGB, KEPT_RGB


@pytest.fixture(scope="module")
def scene(make_slide):
    """2 x 2 mm at 0.5 um/px: an 8 x 8 grid of 256 um cells, two tissue boxes, one blurred box."""
    return make_slide(name="scene", size_um=2048.0, mpp=0.5, seed=2)


@pytest.fixture(scope="module")
def pair(make_slide):
    """One 1.5 mm scene written at 0.25 and at 0.5 um/px."""
    return (
        make_slide(name="fine", size_um=1536.0, mpp=0.25, seed=3),
        make_slide(name="coarse", size_um=1536.0, mpp=0.5, seed=3),
    )


def _src(sample, slide_id: str | None = None, mpp: float | None = None) -> SlideSource:
    return SlideSource(slide_id or sample.path.stem, sample.path, mpp)


def test_kept_tiles_on_tissue_blur_rejected_counts_add_up(scene, tmp_path: Path) -> None:
    [result] = tile_slides([_src(scene)], out_dir=tmp_path, save_tiles=True)
    assert result.status == "ok", result.error
    tf = read_tile_file(output_paths(tmp_path, "scene").h5)
    m = tf.meta
    c = m.counts
    assert c.n_grid == 64
    assert c.n_tissue == c.n_background + c.n_blurry + c.n_unreadable + c.n_kept
    assert c.n_unreadable == 0
    assert result.n == c.n_kept == len(tf) > 10

    kept = {tuple(xy) for xy in tf.coords_um.tolist()}
    for x_um, y_um in kept:
        assert scene.tissue_fraction(x_um, y_um, 256) >= 0.2, (x_um, y_um)  # never on blank glass
        assert scene.blur_fraction(x_um, y_um, 256) < 0.75, (x_um, y_um)
    grid_um = [(i * 256.0, j * 256.0) for j in range(8) for i in range(8)]
    in_blur = [c for c in grid_um if scene.blur_fraction(*c, 256) == 1.0]
    sharp = [
        c for c in grid_um if scene.tissue_fraction(*c, 256) == 1.0 and scene.blur_fraction(*c, 256) == 0
    ]
    assert in_blur and sharp
    assert not kept & set(in_blur)  # every wholly blurred cell was rejected ...
    assert c.n_blurry >= len(in_blur)  # ... as blurry
    assert set(sharp) <= kept  # and no sharp tissue cell was lost
    np.testing.assert_allclose(tf.coords * scene.mpp, tf.coords_um, atol=scene.mpp)
    assert tf.params == TileParams().to_dict()
    assert (m.tile_um, m.tile_px, m.target_mpp, m.mpp) == (256.0, 256, 1.0, 0.5)
    assert (m.level0_width, m.level0_height, m.backend) == (4096, 4096, "openslide")

    # the zarr cache holds exactly the pixels read_region_um gives at the kept coords
    pixels = open_tile_pixels(output_paths(tmp_path, "scene").zarr)
    assert pixels.shape == (len(tf), 256, 256, 3)
    with open_slide(scene.path) as slide:
        for i in (0, len(tf) - 1):
            x, y = tf.coords[i]
            np.testing.assert_array_equal(pixels[i], slide.read_region_um(int(x), int(y), 256.0, 1.0))

    qc = np.asarray(Image.open(output_paths(tmp_path, "scene").qc))
    # 1200 px on the long side, the legend below
    assert qc.shape[2] == 3 and qc.shape[1] == 1200 and qc.shape[0] > 1200
    assert (qc == BLURRY_RGB).all(axis=-1).any()  # blurry tiles bordered in the palette's orange
    assert (qc == KEPT_RGB).all(axis=-1).any()  # kept tiles outlined in the palette's bluish green


def test_same_scene_two_resolutions_same_grid_and_content(pair, tmp_path: Path) -> None:
    fine, coarse = pair
    results = tile_slides([_src(fine), _src(coarse)], out_dir=tmp_path, save_tiles=True)
    assert [r.status for r in results] == ["ok", "ok"]
    a = read_tile_file(output_paths(tmp_path, "fine").h5)
    b = read_tile_file(output_paths(tmp_path, "coarse").h5)
    assert len(a) == len(b) > 0
    np.testing.assert_array_equal(a.coords_um, b.coords_um)
    np.testing.assert_array_equal(a.coords, 2 * b.coords)
    pa = open_tile_pixels(output_paths(tmp_path, "fine").zarr)[:].astype(np.float32)
    pb = open_tile_pixels(output_paths(tmp_path, "coarse").zarr)[:].astype(np.float32)
    assert np.abs(pa - pb).mean() < 6.0  # same content (JPEG and resampling aside)
    assert np.abs(pa - pb[::-1]).mean() > 4 * np.abs(pa - pb).mean() + 1  # and not by accident


def test_both_backends_same_coordinates(pair, tmp_path: Path) -> None:
    fine, _ = pair
    tile_slides([_src(fine)], out_dir=tmp_path / "o", backend="openslide")
    tile_slides([_src(fine)], out_dir=tmp_path / "t", backend="tiffslide")
    a = read_tile_file(output_paths(tmp_path / "o", "fine").h5)
    b = read_tile_file(output_paths(tmp_path / "t", "fine").h5)
    assert b.meta.backend == "tiffslide"
    np.testing.assert_array_equal(a.coords, b.coords)
    assert a.meta.counts == b.meta.counts


def test_rerun_skips_done_slides_and_redoes_on_change(pair, tmp_path: Path) -> None:
    fine, coarse = pair
    sources = [_src(fine), _src(coarse)]
    tile_slides(sources, out_dir=tmp_path)
    h5 = output_paths(tmp_path, "fine").h5
    stamp = h5.stat().st_mtime_ns
    again = tile_slides(sources, out_dir=tmp_path)
    assert [r.status for r in again] == ["skipped", "skipped"]
    assert again[0].n == len(read_tile_file(h5))
    assert h5.stat().st_mtime_ns == stamp
    assert [r.status for r in read_manifest(tmp_path / "tiles" / "manifest.csv")] == ["skipped", "skipped"]
    # other settings -> recomputed; --save-tiles asks for pixels that are missing -> recomputed
    changed = tile_slides(sources[:1], out_dir=tmp_path, params=TileParams(min_tissue_fraction=0.5))
    assert changed[0].status == "ok"
    assert read_tile_file(h5).params["min_tissue_fraction"] == 0.5
    assert tile_slides(sources[1:], out_dir=tmp_path, save_tiles=True)[0].status == "ok"
    assert tile_slides(sources[1:], out_dir=tmp_path, save_tiles=True)[0].status == "skipped"
    assert tile_slides(sources[1:], out_dir=tmp_path, save_tiles=True, overwrite=True)[0].status == "ok"
    # the manifest keeps one row per slide across partial runs
    assert sorted(r.slide_id for r in read_manifest(tmp_path / "tiles" / "manifest.csv")) == [
        "coarse",
        "fine",
    ]


def test_interrupted_write_leaves_nothing_trusted(
    pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, coarse = pair
    src = _src(coarse)
    tile_slides([src], out_dir=tmp_path)  # a finished earlier output, then a forced redo that dies
    real_file = h5py.File

    def dying_file(path, mode="r", *args, **kwargs):
        handle = real_file(path, mode, *args, **kwargs)
        if mode == "w":  # the temporary tile file now exists on disk; die midway through it
            handle.close()
            raise OSError("No space left on device")
        return handle

    monkeypatch.setattr("wsi.formats.tile_file.h5py.File", dying_file)
    [failed] = tile_slides([src], out_dir=tmp_path, overwrite=True, save_tiles=True)
    monkeypatch.undo()
    assert failed.status == "failed" and failed.error.startswith("no space left on")
    paths = output_paths(tmp_path, "coarse")
    assert not paths.h5.exists() and not is_complete(paths.h5)
    assert not [p for p in (tmp_path / "tiles").iterdir() if p.name.startswith(".")]  # no temporaries
    [redo] = tile_slides([src], out_dir=tmp_path, save_tiles=True)
    assert redo.status == "ok" and is_complete(paths.h5)


def test_failed_reads_inside_pool_propagate(pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tile that cannot be read fails the slide (threaded reads do not swallow errors)."""
    fine, _ = pair

    def broken(self, *args, **kwargs):
        raise OSError("bad JPEG tile")

    monkeypatch.setattr("wsi.slides.slide.Slide.read_region_um", broken)
    [r] = tile_slides([_src(fine)], out_dir=tmp_path, threads=2)
    assert r.status == "failed" and r.error == "OSError: bad JPEG tile"
    assert not output_paths(tmp_path, "fine").h5.exists()


def test_bad_inputs_fail_alone_and_rerun_completes_only_missing(pair, tmp_path: Path) -> None:
    _, good = pair
    folder = tmp_path / "slides"
    folder.mkdir()
    shutil.copy(good.path, folder / "good.svs")
    (folder / "notes.svs").write_text("this is not a slide\n")
    write_truncated_copy(good.path, folder / "cut.svs", keep_fraction=0.5)
    (folder / "empty.svs").write_bytes(b"")
    csv_list = tmp_path / "list.csv"
    csv_list.write_text("path,slide_id\nslides/good.svs,good-again\nmissing/gone.svs,gone\n")
    out = tmp_path / "out"

    sources = find_slides([folder, csv_list])
    assert sorted(s.slide_id for s in sources) == ["cut", "empty", "gone", "good", "good-again", "notes"]
    results = {r.slide_id: r for r in tile_slides(sources, out_dir=out)}
    bad = {"cut", "empty", "gone", "notes"}
    assert {k: r.status for k, r in results.items()} == {k: "failed" if k in bad else "ok" for k in results}
    assert set(results) == bad | {"good", "good-again"}
    manifest = {r.slide_id: r for r in read_manifest(out / "tiles" / "manifest.csv")}
    assert "truncated" in manifest["cut"].error and "cut.svs" in manifest["cut"].error
    assert "empty" in manifest["empty"].error
    assert "not found" in manifest["gone"].error and "gone.svs" in manifest["gone"].error
    assert "notes.svs" in manifest["notes"].error and manifest["notes"].error
    for sid in ("cut", "empty", "gone", "notes"):
        assert not output_paths(out, sid).h5.exists()

    # fix the bad files; the re-run does only what is missing
    stamps = {sid: output_paths(out, sid).h5.stat().st_mtime_ns for sid in ("good", "good-again")}
    for name in ("notes.svs", "cut.svs", "empty.svs"):
        shutil.copy(good.path, folder / name)
    (tmp_path / "missing").mkdir()
    shutil.copy(good.path, tmp_path / "missing" / "gone.svs")
    rerun = {r.slide_id: r.status for r in tile_slides(find_slides([folder, csv_list]), out_dir=out)}
    assert rerun == {
        "cut": "ok",
        "empty": "ok",
        "gone": "ok",
        "good": "skipped",
        "good-again": "skipped",
        "notes": "ok",
    }
    assert {sid: output_paths(out, sid).h5.stat().st_mtime_ns for sid in stamps} == stamps
    assert all(r.status in ("ok", "skipped") for r in read_manifest(out / "tiles" / "manifest.csv"))


@pytest.mark.slow
def test_local_cluster_two_workers_same_output(pair, scene, tmp_path: Path) -> None:
    fine, coarse = pair
    sources = [_src(fine), _src(coarse), _src(scene), SlideSource("nothing", tmp_path / "nothing.svs")]
    inline = tile_slides(sources, out_dir=tmp_path / "inline")
    dask = tile_slides(sources, out_dir=tmp_path / "dask", workers=2)
    assert [(r.slide_id, r.status, r.n) for r in dask] == [(r.slide_id, r.status, r.n) for r in inline]
    assert dask[-1].status == "failed" and "not found" in dask[-1].error
    for src in sources[:3]:
        a = read_tile_file(output_paths(tmp_path / "inline", src.slide_id).h5)
        b = read_tile_file(output_paths(tmp_path / "dask", src.slide_id).h5)
        np.testing.assert_array_equal(a.coords, b.coords)


def test_real_cmu_slide_tiles_on_tissue(shared_data: Path, tmp_path: Path) -> None:
    path = shared_data / "slides" / "CMU-1-Small-Region.svs"
    [r] = tile_slides(find_slides([path]), out_dir=tmp_path)
    assert r.status == "ok", r.error
    tf = read_tile_file(output_paths(tmp_path, "CMU-1-Small-Region").h5)
    assert tf.mpp == pytest.approx(0.499) and tf.meta.vendor == "aperio"
    assert tf.meta.counts.n_grid == 20 and 5 <= len(tf) <= 16  # about half the small region is tissue
    with open_slide(path) as slide:
        for x, y in tf.coords.tolist():
            tile = slide.read_region_um(x, y, 256.0, 1.0)
            assert (tile.min(axis=-1) >= 220).mean() < 0.8  # kept tiles are mostly tissue


def test_real_slide_without_mpp(shared_data: Path, tmp_path: Path) -> None:
    path = shared_data / "slides" / "tcga-cr-7395-01a-01-ts1.svs"
    [r] = tile_slides(find_slides([path]), out_dir=tmp_path)
    assert r.status == "failed" and "--mpp" in r.error and path.name in r.error
    [r] = tile_slides(find_slides([path]), out_dir=tmp_path, mpp=0.25)
    assert r.status == "ok" and r.n > 0
    tf = read_tile_file(output_paths(tmp_path, path.stem).h5)
    assert tf.mpp == 0.25 and tf.meta.mpp_source == "--mpp"
    # a re-run that forgets --mpp fails for that slide but does not destroy the earlier output
    [r] = tile_slides(find_slides([path]), out_dir=tmp_path)
    assert r.status == "failed" and "--mpp" in r.error
    assert is_complete(output_paths(tmp_path, path.stem).h5)
    # an `mpp` column in a CSV slide list does the same, per slide; a changed mpp is recomputed
    listing = tmp_path / "slides.csv"
    listing.write_text(f"path,mpp\n{path},0.5\n")
    [r] = tile_slides(find_slides([listing]), out_dir=tmp_path)
    assert r.status == "ok"
    tf = read_tile_file(output_paths(tmp_path, path.stem).h5)
    assert tf.mpp == 0.5 and tf.meta.mpp_source == "slide list"
    assert tf.meta.counts.n_grid == 8 * 6  # 4443 x 3567 px at 0.5 um/px = 2221 x 1783 um


def test_corrupt_jpeg_tile_is_skipped_and_counted_not_fatal(scene, make_slide, tmp_path: Path) -> None:
    """One undecodable JPEG tile costs that tile, not the slide (128 um tiles at 0.5 um/px read level 0)."""
    params = TileParams(tile_um=128.0, tile_px=256)
    # a level-0 JPEG tile (256 px = 128 um) wholly inside sharp tissue
    sharp = [
        (c, r) for r in range(16) for c in range(16)
        if scene.tissue_fraction(c * 128.0, r * 128.0, 128.0) == 1.0
        and scene.blur_fraction(c * 128.0, r * 128.0, 128.0) == 0
    ]  # fmt: skip
    col, row = sharp[0]
    broken = make_slide(name="scene-broken", size_um=2048.0, mpp=0.5, seed=2, corrupt_tiles=[(col, row)])
    [good] = tile_slides([_src(scene, "good")], out_dir=tmp_path, params=params)
    [bad] = tile_slides([_src(broken, "bad")], out_dir=tmp_path, params=params)
    assert good.status == bad.status == "ok", bad.error
    m_good = read_tile_file(output_paths(tmp_path, "good").h5).meta
    m_bad = read_tile_file(output_paths(tmp_path, "bad").h5).meta
    c_good, c_bad = m_good.counts, m_bad.counts
    assert c_bad.n_unreadable == 1 and c_good.n_unreadable == 0
    assert c_bad.n_kept == c_good.n_kept - 1
    assert c_bad.n_tissue == c_bad.n_background + c_bad.n_blurry + c_bad.n_unreadable + c_bad.n_kept
    assert [col * 256, row * 256] not in read_tile_file(output_paths(tmp_path, "bad").h5).coords.tolist()

    # a slide that is mostly unreadable fails with a reason instead of silently losing tissue
    strict = TileParams(tile_um=128.0, tile_px=256, max_unreadable_fraction=0.0)
    [failed] = tile_slides(
        [_src(broken, "strict")], out_dir=tmp_path / "strict", params=strict, save_tiles=True
    )
    assert failed.status == "failed" and "could not be decoded" in failed.error
    paths = output_paths(tmp_path / "strict", "strict")
    assert not paths.h5.exists() and not paths.zarr.exists()  # nothing a re-run or embed could trust


#: The `params` attribute exactly as the tile stage wrote it before TileParams became a wsi.core.config model
#: (`json.dumps(dataclasses.asdict(TileParams()), sort_keys=True)` at commit 6d6463e): a fixed string,
#: so a change in how settings are serialised shows here as recomputed work, never as silent trust.
_PREVIOUS_DEFAULT_PARAMS = (
    '{"max_background_fraction": 0.8, "max_unreadable_fraction": 0.05, "min_blur_variance": 50.0, '
    '"min_tissue_fraction": 0.25, "tile_px": 256, "tile_um": 256.0, "tissue": {"closing_um": 16.0, '
    '"dark_level": 25, "max_hole_um2": 250000.0, "min_region_um2": 20000.0, "min_saturation": 0.05, '
    '"opening_um": 8.0, "thumb_mpp": 8.0}, "white_level": 220}'
)


def _write_previous_version_tile_file(
    path: Path, slide_path: Path, coords: np.ndarray, params: str = _PREVIOUS_DEFAULT_PARAMS
) -> None:
    """A tile file laid out as the previous code wrote it, with raw h5py (no help from wsi.tilefile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as h5:
        h5.create_dataset("coords", data=coords.astype(np.int64))
        h5.create_dataset("coords_um", data=(coords * 0.5).astype(np.float32))
        attrs = {
            "slide_id": "scene", "slide_path": str(slide_path), "tile_size_um": 256.0, "tile_size_px": 256,
            "mpp": 0.5, "mpp_source": "metadata", "target_mpp": 1.0, "level0_width": 4096,
            "level0_height": 4096, "backend": "openslide", "vendor": "aperio",
            "params": params, "wsi_version": "0.1.0", "n_grid": 64, "n_tissue": 3,
            "n_background": 0, "n_blurry": 0, "n_unreadable": 0, "n_kept": 3,
        }  # fmt: skip
        for name, value in attrs.items():
            h5.attrs[name] = value
        h5.attrs["format"] = "wsi-tiles"
        h5.attrs["format_version"] = 1
        h5.attrs["complete"] = True


def test_tile_file_of_the_previous_version_resumes_as_done(scene, tmp_path: Path) -> None:
    """Resume across the config change: a finished tile file written by the previous code, with the same
    settings, is skipped as done (not recomputed); other settings still recompute it. The previous
    string plus the artifact filters' settings and the dark-noise level (fields added since, on purpose:
    see below) is today's."""
    artifacts = {"artifacts": TileParams().artifacts.to_dict()}
    previous = json.loads(_PREVIOUS_DEFAULT_PARAMS)
    previous["tissue"]["dark_noise_sigmas"] = 4.0  # issue 20: the dark slides' noise level, added since
    same = json.dumps(previous | artifacts, sort_keys=True)
    assert json.loads(same) == TileParams().to_dict()  # same keys, same values
    paths = output_paths(tmp_path, "scene")
    coords = np.array([[512, 512], [1024, 512], [512, 1024]])
    _write_previous_version_tile_file(paths.h5, scene.path, coords, params=same)
    paths.qc.parent.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(paths.qc)  # the QC image the previous run left
    stamp = paths.h5.stat().st_mtime_ns
    old = read_tile_file(paths.h5).meta  # loads without the attributes on undecodable parts added since
    assert old.damage is None and old.background is None and old.counts.n_ink == 0

    [again] = tile_slides([_src(scene)], out_dir=tmp_path)
    assert (again.status, again.n) == ("skipped", 3)
    assert paths.h5.stat().st_mtime_ns == stamp

    [changed] = tile_slides([_src(scene)], out_dir=tmp_path, params=TileParams(min_blur_variance=10.0))
    assert changed.status == "ok" and read_tile_file(paths.h5).params["min_blur_variance"] == 10.0
    new = read_tile_file(paths.h5).meta
    assert new.damage.n_thumbnail_unreadable == 0 and list(new.damage.regions) == []


def test_tile_file_from_before_the_artifact_filters_is_recomputed(scene, tmp_path: Path) -> None:
    """Tiles cut before the artifact filters existed may hold ink: their settings lack `artifacts`, so a
    re-run recomputes them rather than trusting them."""
    paths = output_paths(tmp_path, "scene")
    _write_previous_version_tile_file(paths.h5, scene.path, np.array([[512, 512]]))
    paths.qc.parent.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(paths.qc)
    [again] = tile_slides([_src(scene)], out_dir=tmp_path)
    assert again.status == "ok" and "artifacts" in read_tile_file(paths.h5).params

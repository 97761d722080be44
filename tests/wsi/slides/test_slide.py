"""Slides: metadata, level choice, micrometre reads, backends agreeing, real slides and bad inputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from wsi.core.errors import ConfigError, MissingMppError, SlideError
from wsi.slides.slide import BACKENDS, open_slide
from wsi.slides.thumbnail import read_thumbnail
from wsi.synthetic import write_truncated_copy

BOTH = pytest.mark.parametrize("backend", BACKENDS)


def _saturation(rgb: np.ndarray) -> float:
    return float(np.asarray(Image.fromarray(rgb).convert("HSV"))[..., 1].mean())


def _centre_px(box_um, mpp: float) -> tuple[int, int]:
    return round((box_um[0] + box_um[2]) / 2 / mpp), round((box_um[1] + box_um[3]) / 2 / mpp)


@BOTH
def test_opens_generated_slide_with_metadata(sample_slide, backend):
    with open_slide(sample_slide.path, backend=backend) as slide:
        assert slide.backend == backend
        assert slide.vendor == "aperio"
        assert slide.mpp == pytest.approx(0.5)
        assert slide.dimensions == (3000, 3000)
        assert slide.level_dimensions == ((3000, 3000), (1500, 1500), (750, 750), (375, 375), (188, 188))
        assert slide.level_downsamples[:4] == pytest.approx((1.0, 2.0, 4.0, 8.0))
        assert slide.path == sample_slide.path


@BOTH
def test_level_choice_is_cheapest_at_least_as_fine(sample_slide, backend):
    with open_slide(sample_slide.path, backend=backend) as slide:
        assert slide.best_level_for_mpp(0.5) == 0
        assert slide.best_level_for_mpp(0.25) == 0  # finer than level 0: level 0, upsampled
        assert slide.best_level_for_mpp(0.99) == 0  # level 1 (1.0 um/px) would be coarser than asked
        assert slide.best_level_for_mpp(1.0) == 1
        assert slide.best_level_for_mpp(1.005) == 1  # within tolerance of level 1, not level 0
        assert slide.best_level_for_mpp(1.9) == 1
        assert slide.best_level_for_mpp(2.0) == 2
        assert slide.best_level_for_mpp(4.0) == 3
        assert slide.best_level_for_mpp(1000.0) == 4


@BOTH
@pytest.mark.parametrize(
    ("size_um", "target_mpp", "side_px"),
    [(256, 1.0, 256), (256, 0.5, 512), (128, 0.25, 512), (100, 0.7, 143)],
)
def test_read_region_um_shape(sample_slide, backend, size_um, target_mpp, side_px):
    with open_slide(sample_slide.path, backend=backend) as slide:
        tile = slide.read_region_um(1000, 1000, size_um, target_mpp)
    assert tile.shape == (side_px, side_px, 3)
    assert tile.dtype == np.uint8


@BOTH
def test_tissue_background_and_blur_where_the_scene_says(sample_slide, backend):
    s = sample_slide
    with open_slide(s.path, backend=backend) as slide:
        # sharp tissue: upper part of the first box; blurred: centre of the blur box
        t = s.tissue_boxes_um[0]
        sharp = slide.read_region_um(round((t[0] + 40) / s.mpp), round((t[1] + 40) / s.mpp), 200, 1.0)
        bx, by = _centre_px(s.blur_boxes_um[0], s.mpp)
        blurred = slide.read_region_um(bx - 200, by - 200, 200, 1.0)
        glass = slide.read_region_um(0, 0, 50, 1.0)  # top-left corner is blank margin
    assert _saturation(sharp) > 60 and _saturation(blurred) > 60
    assert _saturation(glass) < 10 and glass.mean() > 235

    def lap_var(rgb: np.ndarray) -> float:
        g = rgb.astype(np.float32).mean(axis=2)
        return float((4 * g[1:-1, 1:-1] - g[:-2, 1:-1] - g[2:, 1:-1] - g[1:-1, :-2] - g[1:-1, 2:]).var())

    assert lap_var(sharp) > 10 * lap_var(blurred)


@BOTH
def test_outside_the_slide_is_white_not_an_error(sample_slide, backend):
    with open_slide(sample_slide.path, backend=backend) as slide:
        corner = slide.read_region_um(2900, 2900, 200, 1.0)  # 50 um inside, 150 um outside
        away = slide.read_region_um(-5000, -5000, 100, 1.0)
    assert (corner[60:, :] == 255).all() and (corner[:, 60:] == 255).all()
    assert corner.shape == (200, 200, 3)
    assert (away == 255).all()


def _at_8um(rgb: np.ndarray, mpp: float) -> np.ndarray:
    """Reduce a tile to 8 um/px: compares content, not the details of a resampling filter."""
    return np.asarray(Image.fromarray(rgb).reduce(round(8.0 / mpp)), np.float32)


@BOTH
def test_coarse_level_read_matches_downsampled_fine_read(sample_slide, backend):
    """Reading at 2 um/px from level 2 shows what level 0 shows, at the same micrometres."""
    x, y = _centre_px(sample_slide.tissue_boxes_um[1], 0.5)
    with open_slide(sample_slide.path, backend=backend) as slide:
        assert slide.best_level_for_mpp(2.0) == 2
        coarse = slide.read_region_um(x, y, 256, 2.0)
        fine = slide.read_region_um(x, y, 256, 0.5)
    assert coarse.shape == (128, 128, 3) and fine.shape == (512, 512, 3)
    assert np.abs(_at_8um(coarse, 2.0) - _at_8um(fine, 0.5)).mean() < 3.0


@BOTH
def test_subpixel_origin_on_coarse_level(sample_slide, backend):
    """An origin that is not a multiple of the downsample still reads the right place (no shift)."""
    x, y = _centre_px(sample_slide.tissue_boxes_um[1], 0.5)
    with open_slide(sample_slide.path, backend=backend) as slide:
        a = slide.read_region_um(x + 6, y + 6, 256, 2.0)  # level 2, origin 1.5 px into a pixel
        ref = slide.read_region_um(x + 6, y + 6, 256, 0.5)
        shifted = slide.read_region_um(x + 22, y + 22, 256, 0.5)  # 8 um away
    assert np.abs(_at_8um(a, 2.0) - _at_8um(ref, 0.5)).mean() < 3.0
    assert np.abs(_at_8um(a, 2.0) - _at_8um(shifted, 0.5)).mean() > 3.0


def test_backends_agree_on_pixels(sample_slide):
    s = sample_slide
    x, y = _centre_px(s.tissue_boxes_um[0], s.mpp)
    with open_slide(s.path, backend="openslide") as a, open_slide(s.path, backend="tiffslide") as b:
        assert a.level_dimensions == b.level_dimensions
        assert a.level_downsamples == pytest.approx(b.level_downsamples)
        assert a.mpp == b.mpp
        for xx, yy, size_um, mpp in [
            (x, y, 256, 0.5),
            (x + 7, y - 13, 256, 1.0),
            (x, y, 512, 2.0),
            (100, 2800, 256, 1.0),
        ]:
            ta = a.read_region_um(xx, yy, size_um, mpp).astype(np.int16)
            tb = b.read_region_um(xx, yy, size_um, mpp).astype(np.int16)
            assert np.abs(ta - tb).mean() < 1.0, (xx, yy, size_um, mpp)
        ta, tb = read_thumbnail(a, 8.0).image, read_thumbnail(b, 8.0).image
        assert ta.shape == tb.shape and np.abs(ta.astype(np.int16) - tb).mean() < 1.0


@BOTH
def test_thumbnail_at(sample_slide, backend):
    with open_slide(sample_slide.path, backend=backend) as slide:
        thumb = read_thumbnail(slide, 10.0).image  # 1500 um / 10 um/px
        assert thumb.shape == (150, 150, 3) and thumb.dtype == np.uint8
        assert slide.best_level_for_mpp(10.0) == 4  # coarsest level (8 um/px) does the work
        assert thumb[0, 0].min() > 235  # glass margin


def test_thumbnail_of_a_level_too_big_to_read_at_once(sample_slide, monkeypatch):
    import wsi.slides.thumbnail

    with open_slide(sample_slide.path) as slide:
        whole = read_thumbnail(slide, 3.0).image.astype(np.int16)
        monkeypatch.setattr(wsi.slides.thumbnail, "MAX_THUMB_READ_PX", 1000)
        blocks = read_thumbnail(slide, 3.0).image.astype(np.int16)
    assert whole.shape == blocks.shape == (500, 500, 3)
    assert np.abs(whole - blocks).mean() < 2.0


def test_same_scene_at_two_resolutions_has_the_same_content_in_um(make_slide):
    fine = make_slide(size_um=750.0, mpp=0.25, seed=3)
    coarse = make_slide(size_um=750.0, mpp=0.5, seed=3)
    assert fine.tissue_boxes_um == coarse.tissue_boxes_um
    assert (fine.width_px, coarse.width_px) == (3000, 1500)
    with open_slide(fine.path) as a, open_slide(coarse.path) as b:
        for x_um, y_um in [(100.0, 100.0), (400.0, 150.0), (150.0, 500.0), (0.0, 0.0)]:
            ta = a.read_region_um(round(x_um / 0.25), round(y_um / 0.25), 200, 2.0).astype(np.float32)
            tb = b.read_region_um(round(x_um / 0.5), round(y_um / 0.5), 200, 2.0).astype(np.float32)
            assert np.abs(ta - tb).mean() < 6.0, (x_um, y_um)
        # and a tile moved by 40 um is clearly different: the comparison above can fail
        moved = b.read_region_um(round(140 / 0.5), round(100 / 0.5), 200, 2.0).astype(np.float32)
        first = a.read_region_um(round(100 / 0.25), round(100 / 0.25), 200, 2.0).astype(np.float32)
        assert np.abs(first - moved).mean() > 6.0


# ----------------------------------------------------------------------------------------- metadata
@BOTH
def test_slide_without_mpp_is_refused_unless_given(make_slide, backend):
    s = make_slide(name="nompp", size_um=400.0, mpp=0.5, write_mpp=False)
    with pytest.raises(MissingMppError) as err:
        open_slide(s.path, backend=backend)
    msg = str(err.value)
    assert str(s.path) in msg and "--mpp" in msg and "mpp` column" in msg
    with open_slide(s.path, backend=backend, mpp=0.5) as slide:
        assert slide.mpp == 0.5


def test_user_mpp_overrides_metadata_and_is_validated(sample_slide):
    with open_slide(sample_slide.path, mpp=0.3) as slide:
        assert slide.mpp == 0.3
        assert slide.read_region_um(0, 0, 30, 0.3).shape == (100, 100, 3)
    with pytest.raises(SlideError, match="positive"):
        open_slide(sample_slide.path, mpp=-1.0)


def test_unknown_backend(sample_slide):
    with pytest.raises(ConfigError, match="bioformats"):
        open_slide(sample_slide.path, backend="bioformats")  # type: ignore[arg-type]


@pytest.mark.parametrize(("unit", "res", "expected"), [("CENTIMETER", 40000, 0.25), ("INCH", 50800, 0.5)])
@BOTH
def test_mpp_from_tiff_resolution_tags(tmp_path, backend, unit, res, expected):
    """A plain tiled TIFF (no vendor metadata) takes its mpp from XResolution + ResolutionUnit."""
    path = tmp_path / "plain.tif"
    data = np.full((512, 512, 3), 200, np.uint8)
    tifffile.imwrite(
        path, data, tile=(256, 256), photometric="rgb", resolution=(res, res), resolutionunit=unit
    )
    with open_slide(path, backend=backend) as slide:
        assert slide.mpp == pytest.approx(expected)


@BOTH
def test_tiff_without_resolution_unit_has_no_mpp(tmp_path, backend):
    path = tmp_path / "plain.tif"
    tifffile.imwrite(path, np.full((512, 512, 3), 200, np.uint8), tile=(256, 256), photometric="rgb")
    with pytest.raises(MissingMppError):
        open_slide(path, backend=backend)


# ----------------------------------------------------------------------------------------- real slides
@BOTH
def test_real_cmu_small_region(shared_data, backend):
    with open_slide(shared_data / "slides" / "CMU-1-Small-Region.svs", backend=backend) as slide:
        assert slide.mpp == pytest.approx(0.499)
        assert slide.dimensions == (2220, 2967)
        assert slide.vendor == "aperio"
        tile = slide.read_region_um(1000, 1500, 256, 1.0)
        assert tile.shape == (256, 256, 3)
        assert _saturation(tile) > 30  # the centre of this crop is tissue


@BOTH
def test_near_target_levels_are_read_directly(shared_data, backend):
    """0.499 um/px serves 0.5 (and 1.0 by 2x2 averaging) without resampling: the raw pixels, fast."""
    with open_slide(shared_data / "slides" / "CMU-1-Small-Region.svs", backend=backend) as slide:
        raw = slide.read_level(0, 700, 900, 512, 512)
        assert np.array_equal(slide.read_region_um(700, 900, 256, 0.5), raw)
        half = slide.read_region_um(700, 900, 256, 1.0)
        assert np.array_equal(half, np.asarray(Image.fromarray(raw).reduce(2)))
        # 0.3% is the limit: 0.49 um/px is resampled (P = 522 px from 513 level px)
        assert slide.read_region_um(700, 900, 256, 0.49).shape == (522, 522, 3)


@BOTH
def test_real_tcga_without_mpp(shared_data, backend):
    path = shared_data / "slides" / "tcga-cr-7395-01a-01-ts1.svs"
    with pytest.raises(MissingMppError, match="--mpp") as err:
        open_slide(path, backend=backend)
    assert "tcga-cr-7395-01a-01-ts1.svs" in str(err.value)
    with open_slide(path, backend=backend, mpp=0.25) as slide:
        assert slide.mpp == 0.25
        assert len(slide.level_dimensions) == 2
        assert slide.best_level_for_mpp(0.5) == 1  # downsample 2.0005 is within tolerance
        assert slide.read_region_um(2000, 1500, 256, 1.0).shape == (256, 256, 3)


def test_real_tcga_backends_agree(shared_data):
    """Same pixels on level 0; on level 1 (downsample 2.0005, which openslide resamples by a fraction
    of a pixel) the same place within a small tolerance."""
    path = shared_data / "slides" / "tcga-cr-7395-01a-01-ts1.svs"
    with open_slide(path, mpp=0.25) as a, open_slide(path, backend="tiffslide", mpp=0.25) as b:
        for target_mpp, tol in [(0.25, 0.5), (0.5, 4.5), (1.0, 4.5)]:
            for x, y in [(2000, 1500), (2001, 1503), (0, 1500)]:
                ta = a.read_region_um(x, y, 128, target_mpp).astype(np.int16)
                tb = b.read_region_um(x, y, 128, target_mpp).astype(np.int16)
                assert np.abs(ta - tb).mean() < tol, (x, y, target_mpp)


# ----------------------------------------------------------------------------------------- bad input
def _bad_files(tmp: Path, good: Path) -> dict[str, Path]:
    text = tmp / "notes.svs"
    text.write_text("this is not a slide\n")
    empty = tmp / "empty.svs"
    empty.touch()
    truncated = write_truncated_copy(good, tmp / "truncated.svs", keep_fraction=0.5)
    header_only = write_truncated_copy(good, tmp / "header-only.svs", keep_fraction=0.002)
    return {
        "text": text,
        "empty": empty,
        "truncated": truncated,
        "header-only": header_only,
        "missing": tmp / "missing.svs",
        "folder": tmp,
    }


@BOTH
@pytest.mark.parametrize("kind", ["text", "empty", "truncated", "header-only", "missing", "folder"])
def test_bad_input_raises_slide_error_naming_the_file(tmp_path, sample_slide, backend, kind):
    path = _bad_files(tmp_path, sample_slide.path)[kind]
    with pytest.raises(SlideError) as err:
        open_slide(path, backend=backend)
    assert not isinstance(err.value, MissingMppError)
    assert str(path) in str(err.value)


@BOTH
def test_corrupt_tile_fails_its_read_but_neighbours_read(make_slide, backend):
    s = make_slide(name="corrupt", size_um=1500.0, mpp=0.5, corrupt_tiles=[(4, 3)])
    ((x0, y0, _, _),) = s.corrupt_tile_boxes_px()
    with open_slide(s.path, backend=backend) as slide:
        before = slide.read_region_um(x0 - 256, y0, 128, 0.5)  # the tile to the left
        with pytest.raises(SlideError) as err:
            slide.read_region_um(x0 + 10, y0 + 10, 64, 0.5)
        msg = str(err.value)
        assert str(s.path) in msg and f"x={x0 + 10}" in msg and f"y={y0 + 10}" in msg
        # the slide stays usable after the failed read (openslide needs a reopen for that)
        after = slide.read_region_um(x0 - 256, y0, 128, 0.5)
        assert np.array_equal(before, after)
        assert slide.read_region_um(x0 + 256, y0, 128, 0.5).shape == (256, 256, 3)
        # a coarser level holds its own copy of that area, which is intact
        assert slide.read_region_um(x0, y0, 128, 1.0).shape == (128, 128, 3)


def test_close_and_context_manager(tmp_path, sample_slide):
    copy = tmp_path / "copy.svs"
    shutil.copy(sample_slide.path, copy)
    slide = open_slide(copy)
    slide.close()
    slide.close()  # twice is harmless
    with open_slide(copy) as s2:
        assert "copy.svs" in repr(s2)


@BOTH
def test_threads_sharing_a_slide_only_fail_on_the_bad_tile(make_slide, backend):
    """A failed read must not make other threads' reads of good tiles fail (openslide's sticky errors)."""
    from concurrent.futures import ThreadPoolExecutor

    s = make_slide(name="corrupt", size_um=1500.0, mpp=0.5, corrupt_tiles=[(4, 3)])
    bad = s.corrupt_tile_boxes_px()[0]
    coords = [(x, y) for y in range(0, 3000, 250) for x in range(0, 3000, 250)]

    def is_bad(x: int, y: int) -> bool:  # a 50 um (100 px) read touching the damaged tile
        return x < bad[2] and x + 100 > bad[0] and y < bad[3] and y + 100 > bad[1]

    def read(xy: tuple[int, int]) -> bool:
        try:
            slide.read_region_um(xy[0], xy[1], 50, 0.5)
            return True
        except SlideError:
            return False

    with open_slide(s.path, backend=backend) as slide, ThreadPoolExecutor(4) as pool:
        ok = list(pool.map(read, coords * 2))
    assert ok == [not is_bad(x, y) for x, y in coords * 2]
    assert not all(ok)

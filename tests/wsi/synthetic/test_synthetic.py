"""Sample slides: the scene is where the generator says, deterministic, streamed, and readable by both."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
import tifffile
from click.testing import CliRunner
from PIL import Image

from wsi.slides.slide import open_slide
from wsi.slides.thumbnail import read_thumbnail
from wsi.synthetic import SampleSlide, default_scene, write_sample_slide, write_truncated_copy


def _hsv(rgb: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(rgb).convert("HSV"), np.float32)


def test_scene_geometry(sample_slide: SampleSlide):
    s = sample_slide
    assert (s.width_px, s.height_px, s.mpp) == (3000, 3000, 0.5)
    assert s.width_um == s.height_um == 1500.0
    assert len(s.tissue_boxes_um) == 2 and len(s.blur_boxes_um) == 1
    for x0, y0, x1, y1 in s.tissue_boxes_um:
        assert 0 < x0 < x1 < s.width_um and 0 < y0 < y1 < s.height_um
    bx0, by0, bx1, by1 = s.blur_boxes_um[0]
    tx0, ty0, tx1, ty1 = s.tissue_boxes_um[0]
    assert tx0 <= bx0 < bx1 <= tx1 and ty0 <= by0 < by1 <= ty1  # blur lies inside tissue
    assert s.tissue_fraction(0, 0, 100) == 0.0  # the corner is glass
    assert s.tissue_fraction(tx0 + 10, ty0 + 10, 100) == 1.0
    assert s.blur_fraction(bx0, by0, 100) == 1.0
    assert 0 < s.tissue_fraction(tx0 - 50, ty0 + 10, 100) < 1  # straddles the edge
    covered = sum((b[2] - b[0]) * (b[3] - b[1]) for b in s.tissue_boxes_um) / (s.width_um * s.height_um)
    assert 0.3 < covered < 0.6


def test_default_scene_depends_only_on_micrometres_and_seed():
    assert default_scene(1500, 1500, seed=1) == default_scene(1500, 1500, seed=1)
    assert default_scene(1500, 1500, seed=1) != default_scene(1500, 1500, seed=2)


def test_pixels_follow_the_scene(sample_slide):
    """Every 50 um cell of a 4 um/px thumbnail is tissue (saturated) inside the boxes, glass outside."""
    s = sample_slide
    with open_slide(s.path) as slide:
        thumb = read_thumbnail(slide, 5.0).image  # 300 x 300
    sat = _hsv(thumb)[..., 1]
    cell = 10  # px at 5 um/px = 50 um
    for cy in range(0, 300, cell):
        for cx in range(0, 300, cell):
            frac = s.tissue_fraction(cx * 5.0, cy * 5.0, cell * 5.0)
            mean_sat = sat[cy : cy + cell, cx : cx + cell].mean()
            if frac == 1.0:
                assert mean_sat > 60, (cx, cy)
            elif frac == 0.0:
                assert mean_sat < 10, (cx, cy)


def test_written_mpp_is_read_by_both_backends(make_slide):
    s = make_slide(size_um=300.0, mpp=0.2631)
    for backend in ("openslide", "tiffslide"):
        with open_slide(s.path, backend=backend) as slide:
            assert slide.mpp == pytest.approx(0.2631)
            assert slide.dimensions == (s.width_px, s.height_px) == (1140, 1140)


def test_file_layout_is_aperio_like(sample_slide):
    with tifffile.TiffFile(sample_slide.path) as tif:
        pages = list(tif.pages)
        assert tif.is_svs
        assert pages[0].description.startswith("Aperio Image Library")
        assert "MPP = 0.5" in pages[0].description
        assert pages[0].is_tiled and pages[0].compression == tifffile.COMPRESSION.JPEG
        assert not pages[1].is_tiled  # the stripped thumbnail Aperio puts in IFD 1
        assert [p.shape[:2] for p in pages[2:]] == [(1500, 1500), (750, 750), (375, 375), (188, 188)]
        assert all(p.is_tiled for p in pages[2:])
        assert pages[0].tags["ResolutionUnit"].value == 3  # centimetre
        xres = pages[0].tags["XResolution"].value
        assert xres[0] / xres[1] == pytest.approx(1e4 / 0.5)


def test_no_mpp_means_no_resolution_metadata(make_slide):
    s = make_slide(name="nompp", size_um=400.0, mpp=0.5, write_mpp=False)
    assert not s.mpp_written
    with tifffile.TiffFile(s.path) as tif:
        page = tif.pages[0]
        assert "MPP" not in page.description
        assert page.tags.get("ResolutionUnit") is None or page.tags["ResolutionUnit"].value == 1


def test_deterministic_per_seed(tmp_path):
    a = write_sample_slide(tmp_path / "a.svs", size_um=300.0, mpp=1.0, seed=5)
    b = write_sample_slide(tmp_path / "b.svs", size_um=300.0, mpp=1.0, seed=5)
    c = write_sample_slide(tmp_path / "c.svs", size_um=300.0, mpp=1.0, seed=6)
    with open_slide(a.path) as sa, open_slide(b.path) as sb, open_slide(c.path) as sc:
        ta, tb, tc = (s.read_region_um(0, 0, 300, 1.0) for s in (sa, sb, sc))
    assert np.array_equal(ta, tb)
    assert not np.array_equal(ta, tc)
    assert a.tissue_boxes_um != c.tissue_boxes_um


def test_styles_are_two_visibly_different_classes(make_slide):
    """Style b: fewer, larger, paler nuclei and a bluer hue than style a (what the demo learns)."""
    stats = {}
    for style in ("a", "b"):
        s = make_slide(size_um=600.0, mpp=0.5, style=style, seed=11)
        t = s.tissue_boxes_um[1]
        with open_slide(s.path) as slide:
            tile = slide.read_region_um(round((t[0] + 20) / 0.5), round((t[1] + 20) / 0.5), 200, 0.5)
        hsv = _hsv(tile)
        dark = hsv[..., 2] < 170  # nuclei are the dark pixels
        n = _count_blobs(dark)
        stats[style] = {"hue": float(hsv[..., 0].mean()), "n_nuclei": n, "dark": float(dark.mean())}
    a, b = stats["a"], stats["b"]
    assert a["n_nuclei"] > 1.5 * b["n_nuclei"], stats
    assert b["hue"] < a["hue"] - 5, stats  # PIL hue: pink ~ 230, violet ~ 200 (of 255)


def _count_blobs(mask: np.ndarray) -> int:
    from scipy import ndimage

    labels, _ = ndimage.label(mask)
    sizes = np.bincount(labels.ravel())[1:]
    return int((sizes >= 8).sum())  # ignore specks


def test_corrupt_tile_option_validates_position(tmp_path):
    with pytest.raises(ValueError, match="outside"):
        write_sample_slide(tmp_path / "x.svs", size_um=200.0, mpp=1.0, corrupt_tiles=[(5, 0)])
    assert not (tmp_path / "x.svs").exists()  # nothing half-written is left behind
    assert list(tmp_path.iterdir()) == []


def test_truncated_copy(tmp_path, sample_slide):
    out = write_truncated_copy(sample_slide.path, tmp_path / "t.svs", keep_fraction=0.25)
    assert out.stat().st_size == int(sample_slide.path.stat().st_size * 0.25)
    assert out.read_bytes() == sample_slide.path.read_bytes()[: out.stat().st_size]


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_writing_streams_by_tile(tmp_path):
    """Memory does not grow with the slide: 16x the pixels (48 MB of them) costs no more than 6 MB extra."""
    write_sample_slide(tmp_path / "warm.svs", size_um=100.0, mpp=0.5)  # builds the cached texture
    small = _peak_bytes(lambda: write_sample_slide(tmp_path / "s.svs", size_um=500.0, mpp=0.5))
    big = _peak_bytes(lambda: write_sample_slide(tmp_path / "b.svs", size_um=2000.0, mpp=0.5))
    assert big < small + 6e6, f"peak {small / 1e6:.1f} MB for 1000 px, {big / 1e6:.1f} MB for 4000 px"


def test_real_texture(make_slide, shared_data):
    s = make_slide(size_um=600.0, mpp=0.5, texture="real", seed=2)
    assert s.texture == "real"
    t = s.tissue_boxes_um[0]
    with open_slide(s.path) as slide:
        tile = slide.read_region_um(round((t[0] + 10) / 0.5), round((t[1] + 10) / 0.5), 150, 1.0)
        corner = slide.read_region_um(0, 0, 40, 1.0)
    assert _hsv(tile)[..., 1].mean() > 40 and corner.min() > 235


def test_cli_make_slides(tmp_path):
    from wsi.cli.main import cli

    out = tmp_path / "slides"
    result = CliRunner().invoke(
        cli,
        [
            "make-slides",
            "--out",
            str(out),
            "--n",
            "2",
            "--size-um",
            "400",
            "--mpp",
            "1.0",
            "--style",
            "a",
            "--style",
            "b",
            "--seed",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    records = json.loads((out / "slides.json").read_text())
    assert [r["path"] for r in records] == ["sample-000.svs", "sample-001.svs"]
    assert [r["style"] for r in records] == ["a", "b"] and [r["seed"] for r in records] == [3, 4]
    for r in records:
        with open_slide(out / r["path"], backend="tiffslide") as slide:
            assert slide.dimensions == (400, 400) and slide.mpp == 1.0

    bad = CliRunner().invoke(cli, ["make-slides", "--out", str(out), "--tile-px", "100"])
    assert bad.exit_code == 2 and "multiple of 16" in bad.output
    assert "Examples" in CliRunner().invoke(cli, ["make-slides", "--help"]).output


@pytest.mark.parametrize("backend", ["openslide", "tiffslide"])
def test_explicit_scene_non_square_single_level(tmp_path, backend):
    s = write_sample_slide(
        tmp_path / "one.svs",
        size_um=(400.0, 250.0),
        mpp=1.0,
        n_levels=1,
        tile_px=128,
        tissue_boxes_um=[(0.0, 0.0, 200.0, 250.0)],
        blur_boxes_um=[],
    )
    assert (s.width_px, s.height_px, s.n_levels) == (400, 250, 1)
    with open_slide(s.path, backend=backend) as slide:
        assert slide.level_dimensions == ((400, 250),)
        left = slide.read_region_um(20, 20, 100, 1.0)
        right = slide.read_region_um(280, 20, 100, 1.0)
    assert _hsv(left)[..., 1].mean() > 60 and _hsv(right)[..., 1].mean() < 10

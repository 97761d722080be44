"""QC pictures a pathologist can read: legible size, a legend with the counts per fate, the slide id, mpp
and a scale bar, each tile's mark where that tile is, and the tissue in its own colours (kept tiles are
outlines only; rejected ones are filled by their reason, in a colour-blind-safe palette)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.sources import SlideSource
from wsi.tiling.params import TileParams
from wsi.tiling.qc import (
    BLURRY_RGB,
    FATE_RGB,
    KEPT_RGB,
    QC_LONG_SIDE_PX,
    UNKNOWN_KEY,
    UNKNOWN_RGB,
    QcLegend,
    qc_size,
    render_qc,
)


@pytest.fixture(scope="module")
def scene_qc(make_slide, tmp_path_factory: pytest.TempPathFactory):
    """The 2 x 2 mm scene of test_tile_pipeline (4096 px at 0.5 um/px), tiled: its QC image and tile file."""
    scene = make_slide(name="scene", size_um=2048.0, mpp=0.5, seed=2)
    out = tmp_path_factory.mktemp("qc-run")
    [r] = tile_slides([SlideSource("scene", scene.path)], out_dir=out)
    assert r.status == "ok", r.error
    paths = output_paths(out, "scene")
    return np.asarray(Image.open(paths.qc).convert("RGB")), read_tile_file(paths.h5), scene


def _edge_share(qc: np.ndarray, box: tuple[int, int, int, int], rgb: tuple[int, int, int]) -> float:
    """Fraction of the pixels on the inner border of `box` (x0, y0, x1, y1) that have exactly `rgb`."""
    x0, y0, x1, y1 = box
    region = qc[y0:y1, x0:x1]
    ring = np.ones(region.shape[:2], bool)
    ring[2:-2, 2:-2] = False
    return float((region[ring] == np.asarray(rgb, np.uint8)).all(axis=-1).mean())


def test_qc_is_legible_size_with_legend(scene_qc) -> None:
    qc, _, _ = scene_qc
    assert qc_size((4096, 4096)) == (1200, 1200)
    assert qc.shape[1] == QC_LONG_SIDE_PX >= 1000  # was 256 px: the 8 um/px tissue thumbnail
    assert qc.shape[0] > 1200 + 60  # the legend panel under the map
    panel = qc[1200:]
    assert (panel.min(axis=-1) < 60).mean() > 0.005  # text is written there
    for rgb in (KEPT_RGB, BLURRY_RGB):  # legend swatches in the fates' colours
        assert (panel == np.asarray(rgb, np.uint8)).all(axis=-1).sum() >= 100


def _inside(qc: np.ndarray, box: tuple[int, int, int, int], margin: int = 3) -> np.ndarray:
    x0, y0, x1, y1 = box
    return qc[y0 + margin : y1 - margin, x0 + margin : x1 - margin]


def test_tile_colours_land_on_their_tiles(scene_qc) -> None:
    qc, tf, scene = scene_qc
    scale = 1200 / 4096  # QC px per level-0 px
    step = 256.0 / 0.5
    kept = {tuple(xy) for xy in tf.coords.tolist()}
    assert len(kept) > 10 and tf.meta.counts.n_blurry > 0

    def box(x: float, y: float) -> tuple[int, int, int, int]:
        return round(x * scale), round(y * scale), round((x + step) * scale), round((y + step) * scale)

    for x, y in kept:  # a thin outline in the kept colour; no other fate's
        assert _edge_share(qc, box(x, y), KEPT_RGB) > 0.3, (x, y)
        assert _edge_share(qc, box(x, y), BLURRY_RGB) < 0.1
    # the blurred box of the scene: rejected cells bordered and filled orange, never kept-green
    blurred = [(i * step, j * step) for j in range(8) for i in range(8) if (i * step, j * step) not in kept]
    orange = [c for c in blurred if _edge_share(qc, box(*c), BLURRY_RGB) > 0.5]
    assert len(orange) == tf.meta.counts.n_blurry
    assert all(_edge_share(qc, box(*c), KEPT_RGB) < 0.1 for c in orange)
    for c in orange:  # filled half way to orange: every inside pixel leans to it (but the tissue outline's)
        inside = _inside(qc, box(*c)).astype(int)
        assert (np.abs(inside - np.asarray(BLURRY_RGB)).max(axis=-1) <= 128).mean() > 0.95, c
    # cells on bare glass are left as the slide shows them: no fate colour on their border
    glass = [(i * step, j * step) for j in range(8) for i in range(8)
             if scene.tissue_fraction(i * 256.0, j * 256.0, 256.0) == 0]  # fmt: skip
    assert glass
    for c in glass:
        assert all(_edge_share(qc, box(*c), rgb) < 0.05 for rgb in FATE_RGB.values()), c


def test_the_tissue_of_a_real_slide_keeps_its_colours(shared_data: Path, tmp_path: Path) -> None:
    """The QC map of CMU-1-Small-Region (real H&E) against the slide read at the map's resolution: inside
    every kept tile the pixels are the slide's own, and everywhere but the marks (rejected tiles, tile
    outlines, the tissue outline) they are too; kept tiles used to be tinted green, a quarter of the way."""
    from wsi.slides.slide import open_slide
    from wsi.slides.thumbnail import read_thumbnail
    from wsi.tiling.qc import qc_picture_mpp

    path = shared_data / "slides" / "CMU-1-Small-Region.svs"
    params = TileParams(tile_um=128, tile_px=128)
    [r] = tile_slides([SlideSource("cmu", path)], out_dir=tmp_path, params=params)
    assert r.status == "ok", r.error
    paths = output_paths(tmp_path, "cmu")
    tf = read_tile_file(paths.h5)
    qc = np.asarray(Image.open(paths.qc).convert("RGB")).astype(int)
    w, h = qc_size((2220, 2967))
    with open_slide(path) as slide:
        mpp = qc_picture_mpp(slide.dimensions, slide.mpp, 1e9)  # the map's own um/px
        assert mpp is not None
        thumb = read_thumbnail(slide, mpp).image.astype(int)
    assert thumb.shape[:2] == (h, w)
    scale = w / 2220
    step = 128.0 / tf.mpp
    inside_kept = np.zeros((h, w), bool)
    for x, y in tf.coords.tolist():
        x0, y0 = round(x * scale) + 2, round(y * scale) + 2
        x1, y1 = round((x + step) * scale) - 2, round((y + step) * scale) - 2
        inside_kept[y0:y1, x0:x1] = True
    assert inside_kept.sum() > 0.1 * h * w
    diff = np.abs(qc[:h] - thumb).max(axis=-1)  # (h, w) largest channel difference
    # inside kept tiles: the slide's pixels, but where the tissue outline's dashes cross
    assert (diff[inside_kept] == 0).mean() > 0.97, (diff[inside_kept] == 0).mean()
    assert np.median(diff[inside_kept]) == 0
    # tissue pixels of the whole map (not under a rejected tile): as the slide shows them
    tissue = (thumb.min(axis=-1) < 200) & inside_kept
    assert tissue.sum() > 1000 and (diff[tissue] == 0).mean() > 0.97


def test_small_slide_is_drawn_at_its_own_size_and_counts_in_the_legend(tmp_path: Path) -> None:
    thumb = np.full((300, 200, 3), 240, np.uint8)
    mask = np.zeros((30, 20), bool)
    legend = QcLegend("tiny", "mpp 1 um/px", {"kept": 1, "blurry": 1, "outside tissue": 4})
    tiles = {"kept": np.array([[0, 0]]), "blurry": np.array([[100, 0]])}
    qc = render_qc(thumb, mask, scale=(1.0, 1.0), step_px=100.0, tiles=tiles, legend=legend, um_per_px=2.0)
    assert qc_size((200, 300)) == (200, 300)
    assert qc.shape[0] > 300 and qc.shape[1] >= 200  # the map at 1:1, the panel under it
    assert _edge_share(qc, (0, 0, 100, 100), KEPT_RGB) > 0.45  # a 1 px outline (of the 2 px ring)
    assert (qc[1:99, 1:99] == 240).all()  # a kept tile: its outline, nothing over the slide
    assert _edge_share(qc, (100, 0, 200, 100), BLURRY_RGB) > 0.9
    assert (qc[3:97, 103:197] == (np.asarray(BLURRY_RGB) + 240 + 1) // 2).all()  # filled half way
    bare = render_qc(thumb, mask, scale=(1.0, 1.0), step_px=100.0, tiles=tiles)
    assert bare.shape == (300, 200, 3)  # without a legend: the map alone


def test_the_legend_says_what_was_not_considered_and_has_a_scale_bar() -> None:
    """One count of what the filters judged and what they never saw (grid cells without tissue), and a
    scale bar of a round length at the map's scale."""
    from wsi.tiling.qc_legend import _scale_bar, considered_line

    counts = {"kept": 35, "background": 0, "ink": 4, "outside tissue": 49, UNKNOWN_KEY: 2}
    assert considered_line(counts) == (
        "88 grid cells: 39 with tissue were judged (35 kept, 4 rejected, by reason below); 49 without "
        "tissue were not considered (not drawn)"
    )
    assert _scale_bar(1.2335, 224) == (162, "200 um")  # CMU-1-Small-Region's map, a quarter of its width
    assert _scale_bar(10.0, 250) == (200, "2 mm")
    thumb = np.full((400, 800, 3), 255, np.uint8)
    legend = QcLegend("s", "mpp 1", counts)
    with_bar = render_qc(thumb, np.zeros((4, 8), bool), scale=(1, 1), step_px=50.0, tiles={}, legend=legend,
                         um_per_px=1.0)  # fmt: skip
    without = render_qc(thumb, np.zeros((4, 8), bool), scale=(1, 1), step_px=50.0, tiles={}, legend=legend)
    title_row = slice(400, 430)
    dark = (with_bar[title_row] < 60).all(axis=-1).sum() - (without[title_row] < 60).all(axis=-1).sum()
    assert dark >= 2 * 200 * 0.9  # a bar of 200 um (200 px here), 6 px thick, right of the title


def test_the_palette_is_okabe_ito_and_every_reason_is_apart() -> None:
    """Each filter's reason in a colour of Okabe & Ito's colour-blind-safe set, all apart; the kept
    outline too; unreadable tiles a dark grey border over the slate hatching of what could not be decoded."""
    from wsi.tiling.grid import REASON_NAMES

    okabe_ito = {(0, 0, 0), (230, 159, 0), (86, 180, 233), (0, 158, 115), (240, 228, 66), (0, 114, 178),
                 (213, 94, 0), (204, 121, 167)}  # fmt: skip
    colours = {name: FATE_RGB[name] for name in REASON_NAMES.values()}
    assert len(set(colours.values())) == len(colours)
    assert {rgb for name, rgb in colours.items() if name != "unreadable"} <= okabe_ito
    assert colours["unreadable"] == (64, 64, 64) != UNKNOWN_RGB


def test_params_unchanged_so_old_tile_files_still_resume() -> None:
    """QC and dark-slide handling add no TileParams field (stored settings of earlier runs still match).
    The artifact filters did add one, `artifacts`, on purpose: tiles cut before them may hold ink, so
    a re-run recomputes those slides ("tile settings changed")."""
    assert set(TileParams().to_dict()) == {
        "max_background_fraction", "max_unreadable_fraction", "min_blur_variance", "min_tissue_fraction",
        "tile_px", "tile_um", "tissue", "white_level", "artifacts",
    }  # fmt: skip


@pytest.mark.parametrize("shape", [(1, 1, 3), (3, 700, 3), (1394, 1250, 3)])
def test_png_reads_back_the_same_pixels_in_pillow_and_libpng(
    shape: tuple[int, int, int], tmp_path: Path
) -> None:
    """The QC PNG is written by our own chunk writer around libdeflate (issue 35): the file must be a valid
    PNG (Pillow and libpng both check its CRCs) holding exactly the pixels given."""
    import imagecodecs

    from wsi.tiling.qc import png_bytes, save_png

    image = np.random.default_rng(len(shape) + shape[0]).integers(0, 256, shape, dtype=np.uint8)
    image[: shape[0] // 2] //= 16  # smooth rows too, where the Up filter's differences are small
    path = tmp_path / "qc.png"
    save_png(path, image)
    with Image.open(path) as png:
        png.load()
        assert png.mode == "RGB" and png.size == (shape[1], shape[0])
        assert np.array_equal(np.asarray(png), image)
    assert np.array_equal(imagecodecs.png_decode(path.read_bytes()), image)
    with pytest.raises(ValueError, match="H, W, 3"):
        png_bytes(image[..., 0])


def test_box_blend_in_integers_is_the_float_blend() -> None:
    """Rejected boxes are blended as (v + c + 1) >> 1: the bytes of the float blend at alpha 1/2,
    rounded and clipped, for every byte value and every fate's colour."""
    from wsi.tiling.qc import _FILL_ALPHA, _blend

    assert _FILL_ALPHA == 0.5
    values = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)[None]  # (1, 256, 3)
    for rgb in FATE_RGB.values():
        colour = np.asarray(rgb, np.float32)
        floats = np.clip(values * (1 - _FILL_ALPHA) + _FILL_ALPHA * colour + 0.5, 0, 255).astype(np.uint8)
        np.testing.assert_array_equal(_blend(values, np.asarray(rgb, np.uint16) + 1).astype(np.uint8), floats)

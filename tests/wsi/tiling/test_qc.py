"""QC pictures a pathologist can read (issue 10, item 10): legible size, a legend with the counts per fate,
the slide id and mpp, and each tile's colour where that tile is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.sources import SlideSource
from wsi.tiling.params import TileParams
from wsi.tiling.qc import BLURRY_RGB, FATE_RGB, KEPT_RGB, QC_LONG_SIDE_PX, QcLegend, qc_size, render_qc


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


def test_tile_colours_land_on_their_tiles(scene_qc) -> None:
    qc, tf, scene = scene_qc
    scale = 1200 / 4096  # QC px per level-0 px
    step = 256.0 / 0.5
    kept = {tuple(xy) for xy in tf.coords.tolist()}
    assert len(kept) > 10 and tf.meta.counts.n_blurry > 0

    def box(x: float, y: float) -> tuple[int, int, int, int]:
        return round(x * scale), round(y * scale), round((x + step) * scale), round((y + step) * scale)

    for x, y in kept:
        assert _edge_share(qc, box(x, y), KEPT_RGB) > 0.5, (x, y)
        assert _edge_share(qc, box(x, y), BLURRY_RGB) < 0.1
    # the blurred box of the scene: rejected cells drawn red, never green
    blurred = [(i * step, j * step) for j in range(8) for i in range(8) if (i * step, j * step) not in kept]
    red = [c for c in blurred if _edge_share(qc, box(*c), BLURRY_RGB) > 0.5]
    assert len(red) == tf.meta.counts.n_blurry
    assert all(_edge_share(qc, box(*c), KEPT_RGB) < 0.1 for c in red)
    # cells on bare glass are left as the slide shows them: no fate colour on their border
    glass = [(i * step, j * step) for j in range(8) for i in range(8)
             if scene.tissue_fraction(i * 256.0, j * 256.0, 256.0) == 0]  # fmt: skip
    assert glass
    for c in glass:
        assert all(_edge_share(qc, box(*c), rgb) < 0.05 for rgb in FATE_RGB.values()), c


def test_small_slide_is_drawn_at_its_own_size_and_counts_in_the_legend(tmp_path: Path) -> None:
    thumb = np.full((300, 200, 3), 240, np.uint8)
    mask = np.zeros((30, 20), bool)
    legend = QcLegend("tiny", "mpp 1 um/px", {"kept": 1, "blurry": 1, "outside tissue": 4})
    tiles = {"kept": np.array([[0, 0]]), "blurry": np.array([[100, 0]])}
    qc = render_qc(thumb, mask, scale=(1.0, 1.0), step_px=100.0, tiles=tiles, legend=legend)
    assert qc_size((200, 300)) == (200, 300)
    assert qc.shape[0] > 300 and qc.shape[1] >= 200  # the map at 1:1, the panel under it
    assert _edge_share(qc, (0, 0, 100, 100), KEPT_RGB) > 0.9
    assert _edge_share(qc, (100, 0, 200, 100), BLURRY_RGB) > 0.9
    bare = render_qc(thumb, mask, scale=(1.0, 1.0), step_px=100.0, tiles=tiles)
    assert bare.shape == (300, 200, 3)  # without a legend: the map alone


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
    """QC boxes are blended as (3v + c + 2) >> 2 (issue 35): the bytes of the float blend at alpha 1/4,
    rounded and clipped, for every byte value and every fate's colour."""
    from wsi.tiling.qc import _FILL_ALPHA, _blend

    assert _FILL_ALPHA == 0.25
    values = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)[None]  # (1, 256, 3)
    for rgb in FATE_RGB.values():
        colour = np.asarray(rgb, np.float32)
        floats = np.clip(values * (1 - _FILL_ALPHA) + _FILL_ALPHA * colour + 0.5, 0, 255).astype(np.uint8)
        np.testing.assert_array_equal(_blend(values, np.asarray(rgb, np.uint16) + 2).astype(np.uint8), floats)

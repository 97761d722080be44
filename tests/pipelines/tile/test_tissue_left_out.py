"""The tile stage says what its tissue mask left out (tile file, manifest note, QC legend), and a faintly
stained slide keeps its pale tissue: real pixels written as tiled TIFF slides."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image

import wsi.tiling.qc
from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.sources import SlideSource
from wsi.tiling.params import TileParams, TissueParams

IMAGES = Path(__file__).resolve().parents[3] / "benchmarks" / "images"


def _write(path: Path, rgb: np.ndarray, mpp: float) -> Path:
    res = 1e4 / mpp  # pixels per cm
    tifffile.imwrite(
        path, rgb, tile=(256, 256), photometric="rgb", resolution=(res, res), resolutionunit="CENTIMETER"
    )
    return path


def _note(out: Path) -> str:
    with open(out / "tiles" / "manifest.csv", newline="") as fh:
        [row] = list(csv.DictReader(fh))
    return row["note"]


def test_tissue_left_out_of_the_mask_is_counted_and_shown(tmp_path: Path, monkeypatch) -> None:
    """Blue marker over lavender sections, tiled with a saturation floor (0.3) over the pale tissue:
    the tile file counts the coloured area left out by why, the manifest asks for a look, and the QC
    legend says the same."""
    rgb = np.asarray(Image.open(IMAGES / "tml_lavender_blue-marker.png").convert("RGB"))
    slide = _write(tmp_path / "lavender.tif", rgb, 8.0)
    legends: list[wsi.tiling.qc.QcLegend] = []
    real = wsi.tiling.qc.with_legend

    def spy(picture: np.ndarray, legend: wsi.tiling.qc.QcLegend, *args: float | None) -> np.ndarray:
        legends.append(legend)
        return real(picture, legend, *args)

    monkeypatch.setattr(wsi.tiling.qc, "with_legend", spy)
    params = TileParams(tile_px=32, min_blur_variance=0.0, tissue=TissueParams(min_saturation=0.3))
    [result] = tile_slides([SlideSource("lavender", slide)], out_dir=tmp_path / "floor", params=params)
    assert result.status in ("ok", "empty"), result.error  # the few tiles left may all be marker
    mask = read_tile_file(output_paths(tmp_path / "floor", "lavender").h5).meta.mask
    assert mask is not None and mask.glass_mm2 > mask.tissue_mm2 > 0 and mask.ink_mm2 > 0
    note = _note(tmp_path / "floor")
    assert "outside the tissue mask: " in note and " glass, " in note and "check qc/lavender.png" in note
    [legend] = legends
    assert any(line.startswith("outside the tissue mask: ") for line in legend.notes)

    usual = TileParams(tile_px=32, min_blur_variance=0.0)
    [result] = tile_slides([SlideSource("lavender", slide)], out_dir=tmp_path / "usual", params=usual)
    mask = read_tile_file(output_paths(tmp_path / "usual", "lavender").h5).meta.mask
    assert mask is not None and mask.glass_mm2 < 0.02 * mask.tissue_mm2
    assert "check qc" not in _note(tmp_path / "usual")


def test_faint_stain_keeps_its_pale_tissue(shared_data: Path, tmp_path: Path) -> None:
    """CMU-1-Small-Region's H&E faded to 15% of its optical density (Beer-Lambert: a lightly stained
    section), on glass: its tissue pixels are 200-235, paler than the near-white setting (220), so
    the background filter took them for glass; the slide's own glass/tissue contrast now sets the level."""
    from wsi.slides.slide import open_slide
    from wsi.slides.thumbnail import read_thumbnails

    with open_slide(shared_data / "slides" / "CMU-1-Small-Region.svs") as slide:
        [thumb] = read_thumbnails(slide, (2.0,))
    od = -np.log10(np.maximum(thumb.image.astype(np.float32), 1.0) / 255.0)
    faint = np.clip(255.0 * 10.0 ** (-0.15 * od), 0, 255).astype(np.uint8)
    h, w = faint.shape[:2]
    canvas = np.full((h + 256, w + 256, 3), 250, np.uint8)  # glass around it
    canvas[128 : 128 + h, 128 : 128 + w] = faint
    path = _write(tmp_path / "faint.tif", canvas, 2.0)
    params = TileParams(tile_px=128, min_blur_variance=0.0)  # 2 um/px tiles; blur judged elsewhere
    [result] = tile_slides([SlideSource("faint", path)], out_dir=tmp_path / "out", params=params)
    assert result.status == "ok", result.error
    meta = read_tile_file(output_paths(tmp_path / "out", "faint").h5).meta
    c = meta.counts
    assert c.n_tissue >= 10
    assert c.n_kept >= 0.8 * c.n_tissue, c  # at the 220 setting most were "background"
    assert meta.background is not None and "faint stain" in meta.background.reason
    assert meta.params["white_level"] == 220  # the setting stored is the user's

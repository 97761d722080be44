"""The artifact filters through the tile stage and `wsi tile`: a real inked slide thumbnail written as a
slide, its reasons in the tile file, the manifest, the run summary and the QC picture's legend."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import tifffile
from click.testing import CliRunner
from PIL import Image

from wsi.cli.main import cli
from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.sources import SlideSource
from wsi.tiling.artifacts import FILTERS
from wsi.tiling.grid import REASON_NAMES
from wsi.tiling.params import TileParams
from wsi.tiling.qc import ARTIFACT_RGB, FATE_RGB, QcLegend, render_qc

#: the HistoQC thumbnail is written as a one-level slide at 8 um/px: its own pixels are then both the
#: tissue thumbnail (TissueParams.thumb_mpp 8) and the tiles (256 um at 32 px = 8 um/px)
MPP = 8.0
PARAMS = TileParams(tile_um=256.0, tile_px=32, min_blur_variance=0.0)  # no blur test on a thumbnail


@pytest.fixture(scope="module")
def inked(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """(slide path, ground-truth ink mask) of HistoQC's green-pen thumbnail as a tiled TIFF slide."""
    src = shared_data / "artifacts" / "histoqc" / "pen__1k_version__pen_green.png"
    if not src.is_file():
        pytest.skip(f"{src} not found (see ../shared/data/README.md)")
    rgb = np.asarray(Image.open(src).convert("RGB"))
    truth = np.asarray(Image.open(src.with_name(src.stem + "_mask.png")).convert("L")) > 127
    path = tmp_path_factory.mktemp("inked") / "inked.tif"
    res = 1e4 / MPP  # pixels per cm
    tifffile.imwrite(
        path, rgb, tile=(256, 256), photometric="rgb", resolution=(res, res), resolutionunit="CENTIMETER"
    )
    return path, truth


def _truth_share(truth: np.ndarray, coords: np.ndarray, side: int = 32) -> np.ndarray:
    """(N,) ground-truth ink share of the tiles at level-0 `coords` (level 0 = the mask's pixels)."""
    return np.array([truth[y : y + side, x : x + side].mean() for x, y in coords])


def test_inked_slide_loses_its_ink_tiles_and_says_so(inked, tmp_path: Path) -> None:
    path, truth = inked
    [result] = tile_slides([SlideSource("inked", path)], out_dir=tmp_path, params=PARAMS, backend="tiffslide")
    assert result.status == "ok", result.error
    tf = read_tile_file(output_paths(tmp_path, "inked").h5)
    m = tf.meta
    c = m.counts
    assert c.n_ink >= 20  # the green circle crosses dozens of 256 um tiles
    assert c.n_tissue == c.n_background + c.n_blurry + c.n_unreadable + c.n_kept + sum(
        getattr(c, f"n_{name}") for name in FILTERS
    )
    kept_share = _truth_share(truth, tf.coords)
    assert (kept_share > 0.2).sum() == 0  # no kept tile is more than 20% ink
    assert tf.params["artifacts"]["filters"] == list(FILTERS)
    with open(tmp_path / "tiles" / "manifest.csv", newline="") as fh:
        [row] = list(csv.DictReader(fh))
    assert row["note"].startswith(f"rejected as artifacts: {c.n_ink} ink")
    qc = np.asarray(Image.open(output_paths(tmp_path, "inked").qc))
    assert (qc.reshape(-1, 3) == ARTIFACT_RGB["ink"]).all(axis=1).sum() > 100  # ink tiles, bordered blue


def test_cli_no_filter_keeps_the_ink_and_the_summary_names_each_filter(inked, tmp_path: Path) -> None:
    path, _ = inked
    common = ["tile", str(path), "--tile-um", "256", "--tile-px", "32", "--min-blur-var", "0", "--backend",
              "tiffslide"]  # fmt: skip
    on = CliRunner().invoke(cli, [*common, "--out", str(tmp_path / "on")], catch_exceptions=False)
    assert on.exit_code == 0, on.output
    assert "tiles rejected as artifacts:" in on.stderr and " ink (1 slide)" in on.stderr
    off = CliRunner().invoke(
        cli, [*common, "--out", str(tmp_path / "off"), "--no-filter", "ink"], catch_exceptions=False
    )
    assert off.exit_code == 0, off.output
    m_on = read_tile_file(output_paths(tmp_path / "on", "inked").h5).meta
    m_off = read_tile_file(output_paths(tmp_path / "off", "inked").h5).meta
    assert m_off.counts.n_ink == 0 and m_off.counts.n_kept > m_on.counts.n_kept
    assert "ink" not in m_off.params["artifacts"]["filters"]
    bad = CliRunner().invoke(cli, [*common, "--out", str(tmp_path / "x"), "--no-filter", "smudge"])
    assert bad.exit_code == 2 and "smudge" in bad.output


def test_qc_legend_shows_every_reason() -> None:
    """Every reason code has a colour, and the legend has a swatch of it with its count (even 0)."""
    assert set(REASON_NAMES.values()) <= set(FATE_RGB)
    thumb = np.full((200, 300, 3), 240, np.uint8)
    counts = {name: i for i, name in enumerate(REASON_NAMES.values())}
    tiles = {name: np.array([[i * 30, 0]]) for i, name in enumerate(REASON_NAMES.values())}
    legend = QcLegend("slide", "mpp 1 um/px", counts)
    qc = render_qc(
        thumb, np.zeros((200, 300), bool), scale=(1.0, 1.0), step_px=30.0, tiles=tiles, legend=legend
    )
    panel = qc[200:].reshape(-1, 3)
    for name in REASON_NAMES.values():
        assert (panel == FATE_RGB[name]).all(axis=1).sum() >= 100, name  # a filled swatch in the legend
    assert len({FATE_RGB[name] for name in REASON_NAMES.values()}) == len(REASON_NAMES)  # all distinct

"""A slide with much marker and much blood: its QC picture shows the blood kept and the marker rejected
as ink (named by colour), and with `--filter blood` the blood tiles go as blood, never as ink. MSKCC's
lung thumbnail 00006 (a clot, blood-filled vessels, a black marker rectangle; benchmarks/images, a
tuning image) written as a tiled TIFF slide at its 24 um/px."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile
from click.testing import CliRunner
from PIL import Image

import wsi.tiling.qc
from wsi.cli.main import cli
from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.tile.stage import output_paths
from wsi.tiling.artifacts.colour import hsv, optical_density, red_od_ratio

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))
import artifact_accuracy as bench  # noqa: E402

MPP = 24.0
TILE_ARGS = ["--tile-um", "256", "--tile-px", "32", "--min-blur-var", "0", "--backend", "tiffslide"]


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """(slide path, blood truth, marker truth): blood by the benchmark's own rule (a red hue, saturated,
    bright, absorbing like H&E: OD_R / OD_G 0.19-0.5), marker by its loose black-marker mask."""
    rgb = np.asarray(Image.open(REPO / "benchmarks" / "images" / "mskcc_thumbnail_00006.jpg").convert("RGB"))
    hue, sat, val = hsv(rgb)
    od = optical_density(rgb)
    ratio = red_od_ratio(od)
    blood = ((hue >= 342) | (hue <= 15)) & (sat >= 0.45) & (val >= 0.4) & (od[..., 1] >= 0.5)
    blood &= (ratio >= 0.19) & (ratio <= 0.5)
    marker = np.logical_or.reduce(list(bench.marker_truth(rgb, {"black", "blue", "green", "dark"}).values()))
    path = tmp_path_factory.mktemp("lung") / "lung.tif"
    res = 1e4 / MPP  # pixels per cm
    tifffile.imwrite(
        path, rgb, tile=(256, 256), photometric="rgb", resolution=(res, res), resolutionunit="CENTIMETER"
    )
    return path, blood, marker


def _shares(mask: np.ndarray, coords: np.ndarray, step: float) -> np.ndarray:
    """(N,) share of each tile (level-0 top-left `coords`, side `step` px) that `mask` covers."""
    s = round(step)
    return np.array([mask[y : y + s, x : x + s].mean() if s else 0.0 for x, y in coords])


def _tiled(tmp_path: Path, slide: Path, monkeypatch: pytest.MonkeyPatch, *extra: str):
    """Tile `slide` with the CLI; (QC tiles by fate, the tile file's meta, the manifest note, step px)."""
    drawn: list[dict[str, np.ndarray]] = []
    real = wsi.tiling.qc.render_qc

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        drawn.append({name: np.asarray(c) for name, c in kwargs["tiles"].items()})
        return real(*args, **kwargs)

    monkeypatch.setattr(wsi.tiling.qc, "render_qc", spy)
    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["tile", str(slide), "--out", str(out), *TILE_ARGS, *extra])
    assert res.exit_code == 0, res.output
    meta = read_tile_file(output_paths(out, "lung").h5).meta
    with open(out / "tiles" / "manifest.csv", newline="") as fh:
        [row] = list(csv.DictReader(fh))
    [tiles] = drawn
    return tiles, meta, row["note"], meta.tile_um / meta.mpp


def test_qc_shows_blood_kept_and_marker_rejected(slide, tmp_path: Path, monkeypatch) -> None:
    path, blood, marker = slide
    tiles, meta, note, step = _tiled(tmp_path, path, monkeypatch)
    bloody = {tuple(xy) for xy, b, m in _each(tiles, blood, marker, step) if b >= 0.3 and m == 0}
    inked = {tuple(xy) for xy, b, m in _each(tiles, blood, marker, step) if m > 0.2}
    assert len(bloody) >= 10 and len(inked) >= 100
    kept = {tuple(xy) for xy in tiles["kept"]}
    ink = {tuple(xy) for xy in tiles["ink"]}
    assert len(bloody & kept) >= 0.95 * len(bloody)  # the blood is drawn as kept tissue
    assert len(inked & ink) >= 0.9 * len(inked)  # the marker as ink
    assert meta.ink_colours is not None and sum(meta.ink_colours.values()) == meta.counts.n_ink
    assert meta.counts.n_blood == 0 and "blood" not in note and f"{meta.counts.n_ink} ink (" in note


def test_blood_filter_names_the_blood_and_leaves_the_marker_ink(slide, tmp_path: Path, monkeypatch) -> None:
    path, blood, marker = slide
    tiles, meta, note, step = _tiled(tmp_path, path, monkeypatch, "--filter", "blood")
    bloody = {tuple(xy) for xy, b, m in _each(tiles, blood, marker, step) if b >= 0.5 and m == 0}
    as_blood = {tuple(xy) for xy in tiles["blood"]}
    assert len(bloody & as_blood) >= 0.5 * len(bloody)
    assert meta.counts.n_blood == len(as_blood) > 0 and f"{meta.counts.n_blood} blood" in note
    inked = {tuple(xy) for xy, b, m in _each(tiles, blood, marker, step) if m > 0.2}
    assert len(inked & {tuple(xy) for xy in tiles["ink"]}) >= 0.9 * len(inked)
    assert not as_blood & {tuple(xy) for xy in tiles["ink"]}


def _each(tiles: dict[str, np.ndarray], blood: np.ndarray, marker: np.ndarray, step: float):
    """(tile coords, blood share, marker share) of every tile drawn on the QC picture."""
    coords = np.concatenate([c.reshape(-1, 2) for c in tiles.values()])
    return zip(coords, _shares(blood, coords, step), _shares(marker, coords, step), strict=True)

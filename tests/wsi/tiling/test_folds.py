"""Folds told from dense tissue: a fold is two layers of a fragment's own tissue, far darker than that
fragment's single layer beside it; a biopsy piece dark all over is dense tissue, neither fold nor
(when its stain lies thick and uneven) black ink.

Image: FolDet's oesophagus figure (benchmarks/images/fd_oesophagus_fold.png, tune split, ~21 um/px; its
SOURCES.tsv row): three sections with one real fold, a dark purple wedge at the upper section's left
end (FolDet's own 'Detected folds' frame outlines it). The dark biopsy pieces are painted from the
image's own dense epithelium with its optical density raised (Beer-Lambert: a denser or thicker piece),
on the glass at its upper right: no tuning image holds such pieces.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from wsi.tiling.artifacts import ArtifactParams, find_artifacts, ink_pixels, tile_ink_share
from wsi.tiling.artifacts.colour import hsv, optical_density, thick_stain
from wsi.tiling.tissue import tissue_mask

IMAGES = Path(__file__).resolve().parents[3] / "benchmarks" / "images"
MPP = 21.0
PARAMS = ArtifactParams()
#: the real fold (rows, columns of the image): the dark wedge's core
FOLD = (slice(390, 470), slice(150, 260))
#: dense epithelium the pieces are cut from (lower-left section), and where they go (glass, upper right)
SOURCE = (slice(1000, 1200), slice(120, 330))
PIECES = ((150, 640, 70, 30), (160, 760, 45, 25), (300, 820, 55, 40), (420, 860, 60, 28))


@pytest.fixture(scope="module")
def oesophagus() -> np.ndarray:
    path = IMAGES / "fd_oesophagus_fold.png"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return np.asarray(Image.open(path).convert("RGB"))


def _paint(rgb: np.ndarray, pieces: tuple[tuple[int, int, int, int], ...], gain: float, band: float = 1.0):
    """`rgb` with elliptical pieces (centre row, col, half-axes) of SOURCE tissue on it, their optical
    density times `gain`; with `band` > 1, each piece's middle third (across) times `band` more (a fold
    of the piece). Returns (image, (h, w) bool of the pieces, (h, w) bool of their bands)."""
    out = rgb.copy()
    od = optical_density(rgb[SOURCE])
    where, bands = np.zeros(rgb.shape[:2], bool), np.zeros(rgb.shape[:2], bool)
    for cy, cx, a, b in pieces:
        yy, xx = np.mgrid[-b : b + 1, -a : a + 1]
        inside = (xx / a) ** 2 + (yy / b) ** 2 <= 1
        mid = inside & (np.abs(xx) <= a / 3)
        patch = od[20 : 20 + 2 * b + 1, 40 : 40 + 2 * a + 1] * gain
        patch[mid] *= band
        px = np.clip(255.0 * 10.0 ** (-patch), 0, 255).astype(np.uint8)
        box = (slice(cy - b, cy + b + 1), slice(cx - a, cx + a + 1))
        out[box][inside] = px[inside]
        where[box] |= inside
        bands[box] |= mid if band > 1 else False
    return out, where, bands


def _folds(rgb: np.ndarray) -> np.ndarray:
    return find_artifacts(rgb, tissue_mask(rgb, mpp=MPP), mpp=MPP, params=PARAMS).masks["fold"]


def test_biopsy_pieces_dark_all_over_are_not_folds_the_real_fold_is(oesophagus: np.ndarray) -> None:
    """Pieces of the slide's own dense epithelium with 2.6 times its optical density (value 0.2-0.35, as
    dark against the slide's median tissue as a fold): dense tissue, no fold (all four were folds when
    the slide's median was the only measure). The real fold beside them stays a fold."""
    rgb, pieces, _ = _paint(oesophagus, PIECES, 2.6)
    assert np.median(hsv(rgb[pieces])[2]) < PARAMS.fold_max_value  # as dark as a fold
    fold = _folds(rgb)
    assert not fold[pieces].any()
    assert fold[FOLD].mean() > 0.5


def test_a_fold_across_a_small_piece_is_a_fold(oesophagus: np.ndarray) -> None:
    """Pieces of the same epithelium at their own density, each folded across its middle third (that
    third's optical density doubled): the fold is darker than the piece's own tissue beside it, so the
    small piece's fold is found as before the fragment test (37% of the bands' pixels, the rest paler
    than the fold level; none of the single layer)."""
    rgb, pieces, bands = _paint(oesophagus, PIECES, 1.0, band=2.6)
    fold = _folds(rgb)
    assert fold[bands].mean() > 0.3
    for cy, cx, a, b in PIECES:  # every piece's fold
        box = (slice(cy - b, cy + b + 1), slice(cx - a, cx + a + 1))
        assert fold[box][bands[box]].mean() > 0.2
    assert not fold[pieces & ~bands].any()


def test_a_piece_a_quarter_denser_than_its_own_paler_part_is_no_fold(oesophagus: np.ndarray) -> None:
    """Dense pieces (twice the epithelium's optical density: as dark as a fold against the slide, half
    their pixels) whose middle third is 1.25 times denser again, not twice: one layer stained darker, no
    fold, though each piece holds paler tissue of its own (the fragment test alone called 19% of the
    pieces folds). The same pieces at 1.3 times, folded across (twice as dense), keep their folds."""
    rgb, pieces, _ = _paint(oesophagus, PIECES, 2.0, band=1.25)
    assert (hsv(rgb[pieces])[2] < PARAMS.fold_max_value).mean() > 0.3  # as dark as a fold
    assert _folds(rgb)[pieces].mean() < 0.02
    rgb, pieces, bands = _paint(oesophagus, PIECES, 1.3, band=2.0)
    assert _folds(rgb)[bands].mean() > 0.3


def test_thick_stain_is_not_black_ink_black_marker_is(oesophagus: np.ndarray, shared_data: Path) -> None:
    """The real fold's darkest pixels (value under 0.25: black ink's level) are purple and absorb red and
    blue light far less than green (least / largest OD 0.27-0.33): stain, not black marker. They were
    black ink, and took 51 of the fold's tiles as ink. (Under 5% stay black: the GIF's palette made
    some of them neutral grey.) HistoQC's black pen stroke stays black ink."""
    fold = oesophagus[FOLD]
    dark = hsv(fold)[2] <= PARAMS.black_max_value
    assert dark.mean() > 0.2
    assert ink_pixels(fold, PARAMS)["black"][dark].mean() < 0.05
    tiles = np.stack([fold[y : y + 16, x : x + 16] for y in range(0, 80, 16) for x in range(0, 96, 16)])
    assert tile_ink_share(tiles, PARAMS).mean() < 0.05  # 4 pixels sampled per 16 px tile: a stray grey one
    qc = shared_data / "artifacts" / "histoqc"
    if not qc.is_dir():
        pytest.skip("../shared/data/artifacts/histoqc not found")
    pen = np.asarray(Image.open(qc / "pen__1k_version__pen_black.png").convert("RGB"))
    stroke = np.asarray(Image.open(qc / "pen__1k_version__pen_black_mask.png").convert("L")) > 127
    dark = stroke & (hsv(pen)[2] <= PARAMS.black_max_value)
    assert ink_pixels(pen, PARAMS)["black"][dark].mean() == 1.0


@pytest.mark.parametrize(
    ("od", "stain"),
    [
        ((0.74, 2.11, 0.56), True),  # the fold's median dark pixel: purple, least / largest 0.27
        ((0.90, 1.00, 0.45), False),  # purple-black marker (0.45)
        ((0.80, 0.85, 0.75), False),  # grey-black marker
        ((2.0, 0.6, 0.3), False),  # dark blue marker (hue about 230: a marker's hue stays black)
    ],
)
def test_thick_stain_by_how_evenly_a_pixel_absorbs(od: tuple[float, float, float], stain: bool) -> None:
    """A dark pixel is stain lying thick only when of the stains' hue and absorbing unevenly (least
    channel OD under STAIN_MIN_EVEN of the largest)."""
    rgb = np.clip(255.0 * 10.0 ** (-np.asarray(od)), 0, 255).astype(np.uint8)[None, :]
    hue, sat, val = hsv(rgb)
    assert bool(thick_stain(hue, sat, val)[0]) is stain

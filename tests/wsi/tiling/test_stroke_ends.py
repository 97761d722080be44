"""Marker judged by its place along a stroke: a red stroke's faint end over tissue on the stroke's line
past its end is the stroke's, the same colour beside the stroke is not (`wsi.tiling.artifacts.stroke_ends`);
the pieces of a broken fine grey line are measured together (`grey_marker`)."""

from __future__ import annotations

import numpy as np

from wsi.tiling.artifacts import ArtifactParams, colour_code
from wsi.tiling.artifacts.colour import hsv, optical_density
from wsi.tiling.artifacts.ink import ink_colour_regions
from wsi.tiling.artifacts.stroke_ends import stroke_ends

MPP = 16.0


def _paint(rgb: np.ndarray, where: np.ndarray, od: tuple[float, float, float], seed: int) -> None:
    noise = np.random.default_rng(seed).normal(0, 2, (int(where.sum()), 3))
    rgb[where] = np.clip(255.0 * 10.0 ** (-np.asarray(od)) + noise, 0, 255).astype(np.uint8)


def _slide() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rgb at 16 um/px, the faint patch on the stroke's line, the same patch beside the stroke): a red
    stroke 0.5 mm wide drawn 3 mm over glass up to a section of eosin-rich tissue (OD_R / OD_G about
    0.32; its 10th percentile 0.22), the pen skipping 0.8 mm of tissue, then a faint patch of marker over
    tissue (hue 338, OD_R / OD_G 0.18: under the slide's eosin, but not by the 0.06 that makes a region
    marker whatever its shape, and a blob, not a band)."""
    rng = np.random.default_rng(0)
    rgb = np.full((200, 400, 3), 245, np.uint8)
    tissue = np.zeros((200, 400), bool)
    tissue[:, 150:] = True
    n = int(tissue.sum())
    ratio = np.clip(rng.normal(0.32, 0.08, n), 0.12, 0.6)
    od = np.stack([ratio * 0.6, np.full(n, 0.6), np.full(n, 0.3)], 1)
    rgb[tissue] = np.clip(255 * 10 ** (-od) + rng.normal(0, 2, od.shape), 0, 255).astype(np.uint8)
    stroke = np.zeros_like(tissue)
    stroke[90:120, 10:200] = True
    _paint(rgb, stroke, (0.09, 0.85, 0.7), seed=1)
    on_line, beside = np.zeros_like(tissue), np.zeros_like(tissue)
    on_line[95:115, 250:275] = True  # 0.8 mm past the stroke's end, on its line
    beside[20:40, 250:275] = True  # as far from the stroke, off its line
    for seed, patch in enumerate((on_line, beside), 2):
        _paint(rgb, patch, (0.108, 0.6, 0.35), seed=seed)
    return rgb, on_line, beside


def test_a_red_strokes_faint_end_on_its_line_is_ink_and_the_same_red_beside_it_is_not() -> None:
    rgb, on_line, beside = _slide()
    colours = ink_colour_regions(
        hsv(rgb.astype(np.float32)), optical_density(rgb), mpp=MPP, params=ArtifactParams()
    )
    red = colours == colour_code("red")
    assert red[90:120, 10:200].mean() > 0.9  # the stroke itself
    assert red[on_line].mean() > 0.8  # 0 without the stroke's line
    assert red[beside].mean() < 0.05


def test_a_fine_grey_line_broken_into_pieces_over_tissue_is_ink() -> None:
    """A grey marker line 0.16 mm wide over tissue, broken every 0.64 mm by a gap of 0.16 mm: each piece
    is too short for a band (3.3 times as long as wide), the pieces joined are one long band: black ink.
    The same pieces side by side (a blob when joined) stay tissue."""
    rng = np.random.default_rng(0)
    shape = (200, 480)
    od = np.stack([np.full(shape, 0.25), np.full(shape, 0.45), np.full(shape, 0.3)], -1)
    od += rng.normal(0, 0.01, od.shape)
    line = np.zeros(shape, bool)
    for x in range(20, 440, 50):
        line[60:70, x : x + 40] = True
    scattered = np.zeros(shape, bool)
    for y in (120, 140, 160):  # a patch of pieces 0.16 mm apart: joined, a blob 0.8 x 1.4 mm
        for x in (40, 90):
            scattered[y : y + 10, x : x + 40] = True
    od[line | scattered] += (0.3, 0.3, 0.27)
    rgb = np.clip(255.0 * 10.0 ** (-od), 0, 255).astype(np.uint8)
    colours = ink_colour_regions(
        hsv(rgb.astype(np.float32)), optical_density(rgb), mpp=MPP, params=ArtifactParams()
    )
    black = colours == colour_code("black")
    assert black[line].mean() > 0.8  # 0 without joining the pieces
    assert black[scattered].mean() < 0.05


def test_a_ring_or_a_short_stroke_has_no_line_to_continue() -> None:
    """A marker ring has no ends; a stroke under 1.5 mm or not 5 times as long as wide has no direction
    that a faint end could be judged by. A straight stroke's band lies past both its ends, as wide as
    the stroke and a margin, never over the stroke."""
    yy, xx = np.mgrid[:300, :300]
    r = np.hypot(yy - 150, xx - 150)
    assert not stroke_ends((r >= 90) & (r <= 110), MPP).any()
    short = np.zeros((300, 300), bool)
    short[140:160, 100:180] = True  # 1.3 mm long
    assert not stroke_ends(short, MPP).any()
    line = np.zeros((300, 300), bool)
    line[140:160, 100:220] = True  # 1.9 mm long, 0.32 mm wide
    band = stroke_ends(line, MPP)
    assert band[150, 60] and band[150, 260] and not band[150, 150]
    assert not band[100, 260] and not band[200, 60]  # 50 px (0.8 mm) off the line
    assert not (band & line).any()

"""Per-pixel colour rules for marker ink, in HSV, cheap enough to run on every tile.

Rules of our own, after reading two weight-free detectors:
- histolab (histolab/histolab @202a8bca, src/histolab/filters/image_filters_functional.py:
  green_pen_filter, blue_pen_filter, red_pen_filter) ORs a dozen RGB boxes per colour
  (e.g. blue: R < 60, G < 120, B > 190). Boxes in RGB follow brightness, so faint strokes need
  many boxes; hue and saturation separate ink from stain with one range each.
- HistoQC (choosehappy/HistoQC @b7956129, histoqc/ClassificationModule.py byExampleWithFeatures with
  config pen_markings) trains a per-pixel classifier on example masks (those in ../shared/data/artifacts),
  i.e. needs its training images at run time; we use those masks only to choose and test thresholds.
Hue separates the inks from both H&E stains: eosin is pink-magenta (300-345 degrees), haematoxylin
purple (260-330), DAB brown (10-40, a hue no ink rule uses except black, which is far darker).
"""

from __future__ import annotations

import numpy as np

from wsi.tile_params import ArtifactParams

#: ink colours, in the order they are reported
INK_COLOURS = ("green", "blue", "red", "black")
#: (hue degrees, saturation, value) planes of an image, float32
HSV = tuple[np.ndarray, np.ndarray, np.ndarray]


def hsv(rgb: np.ndarray) -> HSV:
    """Hue (degrees, 0-360), saturation and value (0-1) of (..., 3) uint8 pixels, float32.

    Our own float32 version: skimage's rgb2hsv works in float64 and costs ~4x more per tile."""
    px = rgb[..., :3].astype(np.float32)
    r, g, b = px[..., 0], px[..., 1], px[..., 2]
    high = np.maximum(np.maximum(r, g), b)
    low = np.minimum(np.minimum(r, g), b)
    span = high - low
    safe = np.where(span > 0, span, 1.0)
    hue = np.where(high == r, (g - b) / safe, np.where(high == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe))
    hue = (hue * 60.0) % 360.0
    hue = np.where(span > 0, hue, 0.0)
    sat = np.where(high > 0, span / np.maximum(high, 1.0), 0.0)
    return hue.astype(np.float32), sat.astype(np.float32), (high / 255.0).astype(np.float32)


def ink_pixels(rgb: np.ndarray, params: ArtifactParams) -> dict[str, np.ndarray]:
    """Colour -> (...) bool mask of pixels of (..., 3) uint8 `rgb` that look like that ink."""
    return ink_rules(hsv(rgb), params)


def ink_rules(planes: HSV, params: ArtifactParams) -> dict[str, np.ndarray]:
    """Colour -> bool mask of the pixels of an image's HSV `planes` that look like that ink."""
    hue, sat, val = planes
    p = params
    lit = val >= 0.15  # hue of near-black pixels is noise
    green = lit & (hue >= p.green_hue[0]) & (hue <= p.green_hue[1]) & (sat >= p.green_min_saturation)
    blue = lit & (hue > p.blue_hue[0]) & (hue <= p.blue_hue[1]) & (sat >= p.blue_min_saturation)
    red = lit & ((hue >= p.red_hue_min) | (hue <= p.red_hue_max)) & (sat >= p.red_min_saturation)
    black = val <= p.black_max_value
    return {"green": green, "blue": blue, "red": red, "black": black}


def ink_mask(rgb: np.ndarray, params: ArtifactParams) -> np.ndarray:
    """(...) bool: pixels of any ink colour."""
    masks = ink_pixels(rgb, params)
    out = masks["green"] | masks["blue"] | masks["red"] | masks["black"]
    return out


#: a tile's ink share is measured on every `TILE_STRIDE`-th pixel in each direction (1/64 of them):
#: 1,024 samples of a 256 px tile give its share to about 1% (binomial sd near the 10% threshold), at a
#: fifth of the cost of 1/16 (measured 0.1 vs 0.48 ms per tile, against ~1.4 ms for the background
#: and blur filters)
TILE_STRIDE = 8


def tile_ink_share(tiles: np.ndarray, params: ArtifactParams) -> np.ndarray:
    """(B,) share of ink pixels of (B, P, P, 3) uint8 tiles (sampled every TILE_STRIDE pixels)."""
    sample = tiles[:, ::TILE_STRIDE, ::TILE_STRIDE]
    ink = ink_mask(sample, params)
    return np.count_nonzero(ink, axis=(1, 2)) / max(1, ink.shape[1] * ink.shape[2])

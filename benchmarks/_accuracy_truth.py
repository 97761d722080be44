"""The independent truth `artifact_accuracy.py` scores the filters against where an image has no
hand-drawn mask: loose colour rules for marker (erring toward calling pixels ink, so that the ink-free
negatives stay clear of it) and for tissue, apart from the code they measure."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from wsi.tiling.artifacts import hsv


def marker_truth(rgb: np.ndarray, colours: set[str]) -> dict[str, np.ndarray]:
    """Colour -> (h, w) bool: a loose mask of marker of each given colour, closed over a stroke's streaks;
    looser than the filters' own rules (any saturation of green or blue, grey-black up to value 0.45,
    brown by hue alone), so that it errs toward calling pixels ink and the negatives stay clear of it.
    "dark" (purple-black marker) counts as black; teal as green."""
    hue, sat, val = hsv(rgb)
    lit = val > 0.15
    rules: dict[str, np.ndarray] = {}
    if "green" in colours:
        rules["green"] = lit & (hue >= 120) & (hue <= 200) & (sat >= 0.15)
    if "blue" in colours:
        rules["blue"] = lit & (hue >= 195) & (hue <= 260) & (sat >= 0.3)
    if "black" in colours or "dark" in colours:
        black = (val <= 0.45) & (sat <= 0.45) if "black" in colours else np.zeros(hue.shape, bool)
        rules["black"] = black | (val <= 0.35) if "dark" in colours else black
    if "red" in colours:
        rules["red"] = lit & ((hue >= 340) | (hue <= 20)) & (sat >= 0.4)
    if "brown" in colours:  # orange-brown: hue of DAB, which no H&E slide holds
        rules["brown"] = lit & (hue >= 5) & (hue <= 45) & (sat >= 0.25) & (val <= 0.8)
    out = {}
    for name, mask in rules.items():
        mask = ndimage.binary_opening(mask)
        out[name] = np.asarray(ndimage.binary_closing(mask, iterations=2) | mask)
    return out


def tissue_truth(rgb: np.ndarray) -> np.ndarray:
    """(h, w) bool: coloured pixels that are no marker colour (the benchmark's own rule, apart from the
    code it measures): saturation > 0.1, darkest channel under 215, not blue/green/teal (hue 60-260 at
    saturation >= 0.3) and not black (brightest channel <= 64)."""
    hue, sat, val = hsv(rgb)
    marker = ((hue >= 60) & (hue < 260) & (sat >= 0.3)) | (val <= 0.25)
    return (sat > 0.1) & (rgb.min(axis=-1) < 215) & ~marker

"""Marker ink on the thumbnail: the colour rules of `wsi.artifacts.colour`, then morphology so that a
stroke is one region (its faint, streaky inside included) and stray pixels of tissue are not.

Strokes are grown from their strongly coloured parts into faint red or dark pixels that touch them
(hysteresis, as in Canny's edge linking): faint red alone is also the colour of eosin-rich tissue, and
dark alone that of dense nuclei or DAB, so neither starts a region. The slide's own stain sets no
threshold: ink is judged by colour alone, so a slide that is mostly ink is still caught (a per-slide
split, as for the tissue mask, would call the ink "normal").
"""

from __future__ import annotations

import numpy as np
from skimage.measure import label
from skimage.morphology import closing, disk, opening, remove_small_objects

from wsi.artifacts.colour import hsv, ink_pixels
from wsi.artifacts.params import ArtifactParams

#: strokes are at least this wide (um): thinner ink-coloured specks are tissue (RBCs, pigment) or noise
_MIN_STROKE_UM = 30.0
#: black strokes are at least this wide (um): a coverslip's dark edge (~100 um) is a thinner black line
_MIN_BLACK_STROKE_UM = 200.0
#: gaps inside a stroke (streaks of a drying marker) up to this wide (um) are closed
_GAP_UM = 60.0
#: ink regions smaller than this (um^2) are left alone
_MIN_REGION_UM2 = 40_000.0


def ink_regions(thumb: np.ndarray, *, mpp: float, params: ArtifactParams) -> np.ndarray:
    """(h, w) bool: ink on an (h, w, 3) uint8 thumbnail at `mpp` um/px."""
    colours = ink_pixels(thumb, params)
    strong = colours["green"] | colours["blue"] | colours["red"]
    seeds = _wider_than(strong, _MIN_STROKE_UM / mpp)
    seeds |= _wider_than(colours["black"], _MIN_BLACK_STROKE_UM / mpp)
    strong |= colours["black"]
    if not seeds.any():
        return seeds
    hue, sat, val = hsv(thumb)
    faint = ((hue >= params.red_faint_hue_min) | (hue <= params.red_hue_max)) & (
        sat >= params.red_faint_min_saturation
    )
    # paler black: marker black is brownish or grey (hue under 90 or unsaturated), nuclei are purple
    faint |= (val <= params.black_faint_max_value) & ((hue <= 90.0) | (sat <= 0.2))
    grown = _touching(strong | faint, seeds)
    r_close = round(_GAP_UM / 2 / mpp)
    if r_close >= 1:
        grown = closing(grown, disk(r_close))
    return remove_small_objects(grown, max_size=int(_MIN_REGION_UM2 / (mpp * mpp)))


def _wider_than(mask: np.ndarray, width_px: float) -> np.ndarray:
    """The parts of `mask` at least `width_px` wide (a morphological opening with a disk that wide)."""
    r = round(width_px / 2)
    return opening(mask, disk(r)) if r >= 1 else mask


def _touching(candidates: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """The connected parts of `candidates` (8-connected) that hold at least one seed pixel."""
    labels = label(candidates | seeds, connectivity=2)
    keep = np.unique(labels[seeds])
    keep = keep[keep > 0]
    return np.isin(labels, keep)

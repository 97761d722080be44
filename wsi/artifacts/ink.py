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

from wsi.artifacts.colour import HSV, ink_rules
from wsi.artifacts.morph import closing, opening
from wsi.morphology import label, remove_small_objects
from wsi.tile_params import ArtifactParams

#: strokes are at least this wide (um): thinner ink-coloured specks are tissue (RBCs, pigment) or noise
_MIN_STROKE_UM = 30.0
#: black strokes are at least this wide (um): a coverslip's dark edge (~100 um) is a thinner black line
_MIN_BLACK_STROKE_UM = 200.0
#: gaps inside a stroke (streaks of a drying marker) up to this wide (um) are closed
_GAP_UM = 60.0
#: ink regions smaller than this (um^2) are left alone
_MIN_REGION_UM2 = 40_000.0


def ink_regions(
    planes: HSV, *, mpp: float, params: ArtifactParams, exclude: np.ndarray | None = None
) -> np.ndarray:
    """(h, w) bool: ink on a thumbnail (its HSV `planes`) at `mpp` um/px; `exclude`: pixels that are
    another artifact already (out-of-scan fill is as black as black ink)."""
    colours = ink_rules(planes, params)
    if exclude is not None:
        colours = {name: mask & ~exclude for name, mask in colours.items()}
    strong = colours["green"] | colours["blue"] | colours["red"]
    seeds = opening(strong, _MIN_STROKE_UM / 2 / mpp)
    seeds |= opening(colours["black"], _MIN_BLACK_STROKE_UM / 2 / mpp)
    if not seeds.any():
        return seeds
    hue, sat, val = planes
    faint = ((hue >= params.red_faint_hue_min) | (hue <= params.red_hue_max)) & (
        sat >= params.red_faint_min_saturation
    )
    # paler black: marker black is brownish or grey (hue under 90 or unsaturated), nuclei are purple
    faint |= (val <= params.black_faint_max_value) & ((hue <= 90.0) | (sat <= 0.2))
    if exclude is not None:
        faint &= ~exclude
    grown = closing(_touching(strong | colours["black"] | faint, seeds), _GAP_UM / 2 / mpp)
    return remove_small_objects(grown, max_size=int(_MIN_REGION_UM2 / (mpp * mpp)))


def _touching(candidates: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """The connected parts of `candidates` (8-connected) that hold at least one seed pixel."""
    labels = label(candidates | seeds, connectivity=2)
    keep = np.zeros(int(labels.max()) + 1, bool)
    keep[labels[seeds]] = True
    keep[0] = False
    return keep[labels]

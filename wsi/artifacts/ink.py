"""Marker ink on the thumbnail: the colour rules of `wsi.artifacts.colour`, a test of each red or black
candidate region's optical density, then morphology so that a stroke is one region (its faint, streaky
inside included) and stray pixels of tissue are not.

1. Seeds: pixels of an ink colour in parts at least a stroke wide (an opening): thinner specks are
   tissue (red blood cells, pigment) or noise.
2. Red and black seed regions are kept only when the median optical-density signature of their dense
   pixels says marker (`colour.red_od_ratio`, `colour.neutrality`): a pool of blood, eosin-rich muscle,
   a fold or a lymphoid aggregate has the colour of a marker but absorbs like H&E.
3. Strokes grow from the seeds into faint red or dark pixels that touch them (hysteresis, as in Canny's
   edge linking), but only within `_GROW_UM` of a seed: faint red is also the colour of eosin, so an
   unbounded growth from a stroke at the edge of the tissue would take the stroma beside it.

The slide's own stain sets no threshold: ink is judged by how it absorbs, so a slide that is mostly ink
is still caught (a per-slide split, as for the tissue mask, would call the ink "normal").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import ndimage
from skimage.measure import label
from skimage.morphology import remove_small_objects

from wsi.artifacts.colour import (
    BLACK_DENSE_OD, HSV, RED_DENSE_OD, ink_rules, median_margin, neutrality, red_od_ratio,
)  # fmt: skip
from wsi.artifacts.morph import closing, dilate, opening
from wsi.tile_params import ArtifactParams

#: strokes are at least this wide (um): thinner ink-coloured specks are tissue (RBCs, pigment) or noise
_MIN_STROKE_UM = 30.0
#: black strokes are at least this wide (um): a coverslip's dark edge (~100 um) is a thinner black line
_MIN_BLACK_STROKE_UM = 200.0
#: gaps inside a stroke (streaks of a drying marker) up to this wide (um) are closed
_GAP_UM = 60.0
#: faint ink is grown at most this far (um) from a stroke's seed: a marker stroke is 0.5-2 mm wide
_GROW_UM = 600.0
NEAR_RATIO = 0.26
NEAR_UM = 500.0
#: ink regions smaller than this (um^2) are left alone
_MIN_REGION_UM2 = 40_000.0


def ink_regions(
    planes: HSV,
    od: np.ndarray,
    *,
    mpp: float,
    params: ArtifactParams,
    exclude: np.ndarray | None = None,
) -> np.ndarray:
    """(h, w) bool: ink on a thumbnail (its HSV `planes` and (h, w, 3) optical density `od`) at `mpp`
    um/px; `exclude`: pixels that are another artifact already (out-of-scan fill is as black as ink)."""
    colours = ink_rules(planes, params)
    if exclude is not None:
        colours = {name: mask & ~exclude for name, mask in colours.items()}
    red_parts = opening(colours["red"], _MIN_STROKE_UM / 2 / mpp)
    ratio, dense = red_od_ratio(od), od[..., 1] >= RED_DENSE_OD
    red = _marker_regions(red_parts, ratio, dense, lambda m: m <= params.red_max_od_ratio, +1, mpp)
    if red.any() and NEAR_RATIO > params.red_max_od_ratio:
        # marker over tissue absorbs the tissue's red light too: a part next to a sure stroke is
        # marker up to NEAR_RATIO
        near = _marker_regions(red_parts & ~red, ratio, dense, lambda m: m <= NEAR_RATIO, 0, mpp)
        red |= _touching(near | dilate(red, NEAR_UM / mpp), red) & near
    
    black = _marker_regions(
        opening(colours["black"], _MIN_BLACK_STROKE_UM / 2 / mpp),
        neutrality(od), od.max(axis=-1) >= BLACK_DENSE_OD, lambda m: m >= params.black_min_neutrality, -1, mpp,
    )  # fmt: skip
    hue, sat, val = planes
    faint_red = ((hue >= params.red_faint_hue_min) | (hue <= params.red_hue_max)) & (
        sat >= params.red_faint_min_saturation
    )
    # paler black: marker black is brownish or grey (hue under 90 or unsaturated), nuclei are purple
    faint_black = (val <= params.black_faint_max_value) & ((hue <= 90.0) | (sat <= 0.2))
    grown = (
        opening(colours["green"] | colours["blue"], _MIN_STROKE_UM / 2 / mpp)
        | _grown(red, colours["red"] | faint_red, mpp)
        | _grown(black, colours["black"] | faint_black, mpp)
    )
    if exclude is not None:
        grown &= ~exclude
    if not grown.any():
        return grown
    grown = closing(grown, _GAP_UM / 2 / mpp)
    return remove_small_objects(grown, max_size=int(_MIN_REGION_UM2 / (mpp * mpp)))


def _grown(seeds: np.ndarray, candidates: np.ndarray, mpp: float) -> np.ndarray:
    """`seeds` with the parts of `candidates` within _GROW_UM of them that touch them."""
    if not seeds.any():
        return seeds
    return _touching(candidates & dilate(seeds, _GROW_UM / mpp), seeds)


def _marker_regions(
    seeds: np.ndarray,
    signature: np.ndarray,
    dense: np.ndarray,
    is_marker: Callable[[np.ndarray], np.ndarray],
    side: int,
    mpp: float,
) -> np.ndarray:
    """The connected parts of `seeds` whose median `signature` over their `dense` pixels passes
    `is_marker`, judged on the median moved toward tissue by `colour.median_margin` (`side` +1: up,
    -1: down, 0: not moved), so that the median of a few pixels, mostly noise, does not make a speck of
    blood a marker."""
    if not seeds.any():
        return seeds
    # the streaks of one stroke (a drying marker) are one region: labelled after closing their gaps
    labels, n = ndimage.label(seeds, structure=np.ones((3, 3), bool))
    measured = np.where(dense & seeds, labels, 0)
    index = np.arange(1, n + 1)
    counts = np.bincount(measured.ravel(), minlength=n + 1)[1:]
    has = counts > 0
    medians = np.full(n, np.nan)
    if has.any():
        medians[has] = ndimage.median(signature, labels=measured, index=index[has])
        medians[has] += side * median_margin(counts[has])
    keep = np.zeros(n + 1, bool)
    with np.errstate(invalid="ignore"):
        keep[1:] = has & is_marker(medians)
    return keep[labels] & seeds


def _touching(candidates: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """The connected parts of `candidates` (8-connected) that hold at least one seed pixel."""
    labels = label(candidates | seeds, connectivity=2)
    keep = np.zeros(int(labels.max()) + 1, bool)
    keep[labels[seeds]] = True
    keep[0] = False
    return keep[labels]

"""Marker ink on the thumbnail: the colour rules of `wsi.tiling.artifacts.colour`, a test of each red region's
optical density, then morphology so that a stroke is one region (its faint, streaky inside included)
and stray pixels of tissue are not.

1. Seeds: pixels of an ink colour in parts at least a stroke wide (an opening): thinner specks are
   tissue (red blood cells, pigment) or noise. Black seeds must be wider still (200 um): dense nuclei
   and a coverslip's dark edge are as dark as black marker, but narrower than its stroke.
2. A red seed region is marker only when its dense pixels absorb like marker, not like H&E
   (`colour.red_od_ratio`: the median ratio, moved toward tissue by `colour.median_margin`, at most
   `red_max_od_ratio`): a pool of blood or eosin-rich muscle has the colour of a red marker but absorbs
   red light like eosin. Marker drawn over tissue adds the tissue's own absorption; a red region up to
   `_NEAR_RATIO` within `_NEAR_UM` of a sure stroke is that stroke going over tissue.
3. Strokes grow from their seeds into faint pixels of their own colour that touch them (hysteresis, as in
   Canny's edge linking). Red grows only within `_GROW_UM`: faint red is also the colour of eosin, so a
   growth without bound from a stroke at the edge of the tissue would take the stroma beside it. Faint
   black (grey or brownish, never purple) follows a stroke all along: a marker loop is dark enough to seed
   at its ends only (MSKCC's thumbnail 283: 420 of its 574 ink tiles).

The slide's own stain sets no threshold: ink is judged by how it absorbs, so a slide that is mostly ink
is still caught (a per-slide split, as for the tissue mask, would call the ink "normal").
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from wsi.tiling.artifacts.colour import HSV, RED_DENSE_OD, ink_rules, median_margin, red_od_ratio
from wsi.tiling.morphology import close_disk, dilate_disk, label, open_disk, remove_small_objects
from wsi.tiling.params import ArtifactParams

#: strokes are at least this wide (um): thinner ink-coloured specks are tissue (RBCs, pigment) or noise
_MIN_STROKE_UM = 30.0
#: black strokes are at least this wide (um): a coverslip's dark edge (~100 um) is a thinner black line
_MIN_BLACK_STROKE_UM = 200.0
#: gaps inside a stroke (streaks of a drying marker) up to this wide (um) are closed
_GAP_UM = 60.0
#: faint ink is grown at most this far (um) from a stroke's seed (a marker stroke is 0.5-2 mm wide;
#: 300, 600 and 1,000 um were tried on the tuning images: 600 keeps the streaky halo of HistoQC's red
#: strokes, 1,000 adds no ink tile there and grows further into eosin beside a stroke)
_GROW_UM = 600.0
#: red marker over tissue: its ratio rises toward the tissue's (0.20-0.25 measured where HistoQC's red
#: strokes cross tissue); accepted up to this next to a sure stroke
_NEAR_RATIO = 0.26
#: ... within this distance (um) of it
_NEAR_UM = 500.0
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
    hue, sat, val = planes
    faint_red = ((hue >= params.red_faint_hue_min) | (hue <= params.red_hue_max)) & (
        sat >= params.red_faint_min_saturation
    )
    # paler black: marker black is brownish or grey (hue under 90 or unsaturated), nuclei are purple
    faint_black = (val <= params.black_faint_max_value) & ((hue <= 90.0) | (sat <= 0.2))
    red = _red_strokes(open_disk(colours["red"], _MIN_STROKE_UM / 2 / mpp), od, mpp=mpp, params=params)
    black = open_disk(colours["black"], _MIN_BLACK_STROKE_UM / 2 / mpp)
    grown = (
        open_disk(colours["green"] | colours["blue"], _MIN_STROKE_UM / 2 / mpp)
        | _grown(red, colours["red"] | faint_red, mpp, _GROW_UM)
        # faint black is grey or brownish, never the purple of nuclei: it may follow a stroke all along
        | _grown(black, colours["black"] | faint_black, mpp, None)
    )
    if exclude is not None:
        grown &= ~exclude
    if not grown.any():
        return grown
    grown = close_disk(grown, _GAP_UM / 2 / mpp)
    return remove_small_objects(grown, max_size=int(_MIN_REGION_UM2 / (mpp * mpp)))


def _red_strokes(parts: np.ndarray, od: np.ndarray, *, mpp: float, params: ArtifactParams) -> np.ndarray:
    """The red `parts` that are marker: sure strokes by their own optical density, and the parts next to
    them where a stroke goes over tissue."""
    ratio, dense = red_od_ratio(od), od[..., 1] >= RED_DENSE_OD
    # a stroke drawn up to a pool of blood is one red region with it: parted where the pixels absorb
    # more red light than marker over tissue does, so that each part is judged on its own
    parts = parts & ~(dense & (ratio > _NEAR_RATIO))
    sure = _regions_under(parts, ratio, dense, params.red_max_od_ratio, margin=True)
    if not sure.any() or params.red_max_od_ratio >= _NEAR_RATIO:
        return sure
    near = _regions_under(parts & ~sure, ratio, dense, _NEAR_RATIO, margin=False)
    return sure | (_touching(near | dilate_disk(sure, _NEAR_UM / mpp), sure) & near)


def _regions_under(
    parts: np.ndarray, ratio: np.ndarray, dense: np.ndarray, limit: float, *, margin: bool
) -> np.ndarray:
    """The connected parts of `parts` whose median `ratio` over their `dense` pixels is at most `limit`
    (moved up by `colour.median_margin` when `margin`, so that the median of a few pixels, mostly noise,
    does not make a speck of blood a marker); a part without dense pixels cannot be told from tissue."""
    labels, n = ndimage.label(parts, structure=np.ones((3, 3), bool))
    if n == 0:
        return parts
    measured = np.where(dense, labels, 0)
    counts = np.bincount(measured.ravel(), minlength=n + 1)[1:]
    has = counts > 0
    keep = np.zeros(n + 1, bool)
    if has.any():
        index = np.arange(1, n + 1)[has]
        medians = np.asarray(ndimage.median(ratio, labels=measured, index=index), np.float64)
        if margin:
            medians = medians + median_margin(counts[has])
        keep[index] = medians <= limit
    return keep[labels]


def _grown(seeds: np.ndarray, candidates: np.ndarray, mpp: float, reach_um: float | None) -> np.ndarray:
    """`seeds` with the parts of `candidates` that touch them (within `reach_um` of them; None: any)."""
    if not seeds.any():
        return seeds
    if reach_um is not None:
        candidates = candidates & dilate_disk(seeds, reach_um / mpp)
    return _touching(candidates, seeds)


def _touching(candidates: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """The connected parts of `candidates` (8-connected) that hold at least one seed pixel."""
    labels = label(candidates | seeds, connectivity=2)
    keep = np.zeros(int(labels.max()) + 1, bool)
    keep[labels[seeds]] = True
    keep[0] = False
    return keep[labels]

"""Marker ink and tissue-marking dye on the thumbnail: the colour rules of `wsi.tiling.artifacts.colour`,
a test of each red region's optical density, the shape of a stroke (`strokes`), then morphology so that
a stroke is one region (its faint, streaky inside included) and stray pixels of tissue are not. The
result names each stroke's colour (`ink_colour_regions`), which the tile file records per tile.

1. Seeds: pixels of an ink colour in parts at least a stroke wide (an opening): thinner specks are
   tissue (red blood cells, pigment) or noise. Black seeds must be wider still (200 um): dense nuclei
   and a coverslip's dark edge are as dark as black marker, but narrower than its stroke.
2. A red seed region is marker only when its dense pixels absorb like marker, not like H&E
   (`colour.red_od_ratio`: the median ratio, moved toward tissue by `colour.median_margin`, at most
   `red_max_od_ratio` and at most the slide's own eosin, `colour.eosin_ratios`): a pool of blood or
   eosin-rich muscle has the colour of a red marker but absorbs red light like eosin. One number is not
   enough where haemorrhage has been measured as low as 0.13: a region must also hold a few dense
   pixels (`_MIN_DENSE`; a pixel of JPEG noise is no stroke), and unless it absorbs less red light than
   blood ever does (`_STRONG_RATIO`) or far less than the slide's own eosin (`_EOSIN_GAP`), be shaped
   like a stroke (`strokes.RED_BAND`: a band, where a pool or a clot is a blob). Marker drawn over
   tissue adds the tissue's own absorption; a red region up to `_NEAR_RATIO` within `_NEAR_UM` of a sure
   stroke is that stroke going over tissue.
3. Strokes grow from their seeds into faint pixels of their own colour that touch them (hysteresis, as in
   Canny's edge linking). Red grows only into pixels of the strokes' own hue (`_STROKE_HUE_DEG`), whose
   ratio is nearer the strokes' than the slide's eosin (`_GROW_TOWARD_EOSIN`), and only within
   `_GROW_UM`: faint red is also the colour of eosin, so a growth without bound from a stroke at the
   edge of the tissue would take the stroma beside it. Each grown part is then judged as a whole: one
   whose median absorbs as much red light as the slide's own eosin is that eosin (`_grown_red`), and a
   red part next to a stroke is that stroke over tissue only while it absorbs less than the slide's
   eosin. A straight stroke's faint end over tissue, often broken off where the pen skipped, lies on
   its line past its end (`stroke_ends`): there, red pixels nearer the slide's least eosin ratio than
   its median are the stroke's. Faint black (grey or brownish, never purple) follows a stroke all
   along: a marker loop is dark enough to seed at its ends only (MSKCC's thumbnail 283: 420 of its 574
   ink tiles).
4. Colours that tissue also takes are ink only as strokes (`strokes`): brown marker (DAB's colour; only
   on a slide stained with eosin, never on IHC), yellow dye, and translucent grey or purple-black marker
   (the colour of dense nuclei) as long bands that absorb the three colours alike; over tissue, whose
   colour it takes, grey marker is found by the grey optical density it adds to the tissue around it
   (`grey_marker`).

The slide's own stain sets no colour threshold of the seeds: ink is judged by how it absorbs, so a slide
that is mostly ink is still caught (a per-slide split, as for the tissue mask, would call the ink
"normal"); the slide's eosin only caps the red ratio and bounds the growth.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from wsi.tiling.artifacts.colour import (
    HSV,
    INK_COLOURS,
    RED_DENSE_OD,
    EosinRatios,
    colour_code,
    dye_rules,
    eosin_ratios,
    ink_rules,
    median_margin,
    red_od_ratio,
)
from wsi.tiling.artifacts.grey_marker import grey_bands
from wsi.tiling.artifacts.stroke_ends import continued_red
from wsi.tiling.artifacts.stroke_inside import stroke_inside
from wsi.tiling.artifacts.strokes import (
    BROWN_BAND,
    DYE_BAND,
    RED_BAND,
    STREAK_GAP_UM,
    bands,
    region_shapes,
)
from wsi.tiling.morphology import (
    close_disk,
    dilate_disk,
    label,
    open_disk,
    remove_small_objects,
)
from wsi.tiling.params import ArtifactParams

#: strokes are at least this wide (um): thinner ink-coloured specks are tissue (RBCs, pigment) or noise
_MIN_STROKE_UM = 30.0
#: black strokes are at least this wide (um): a coverslip's dark edge (~100 um) is a thinner black line
_MIN_BLACK_STROKE_UM = 200.0
#: faint ink is grown at most this far (um) from a stroke's seed (a marker stroke is 0.5-2 mm wide):
#: 600 keeps the streaky halo of HistoQC's red strokes; with parts that absorb like the slide's eosin
#: left out (`_grown_red`), 900-1,200 also follow their streaks over tissue (2-3 more ink tiles on the
#: tuning images, none of their ink-free tissue)
_GROW_UM = 1000.0
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
    return ink_colour_regions(planes, od, mpp=mpp, params=params, exclude=exclude) > 0


def ink_colour_regions(
    planes: HSV,
    od: np.ndarray,
    *,
    mpp: float,
    params: ArtifactParams,
    exclude: np.ndarray | None = None,
    lines: np.ndarray | None = None,
) -> np.ndarray:
    """(h, w) uint8: the colour of the ink at each pixel (`colour.colour_code`: 1 + its index in
    INK_COLOURS; 0 none), as `ink_regions` finds it. Where two colours' strokes meet, the later colour
    of INK_COLOURS wins (a black stroke end over a brown stroke is black). `lines`: the bubble filter's
    rims and coverslip edges (`grey_marker.grey_bands`)."""
    colours = ink_rules(planes, params)
    colours.update(dye_rules(planes, od))
    if exclude is not None:
        colours = {name: mask & ~exclude for name, mask in colours.items()}
    hue, sat, val = planes
    faint_red = ((hue >= params.red_faint_hue_min) | (hue <= params.red_hue_max)) & (
        sat >= params.red_faint_min_saturation
    )
    # paler black: marker black is brownish or grey (hue under 90 or unsaturated), nuclei are purple
    faint_black = (val <= params.black_faint_max_value) & ((hue <= 90.0) | (sat <= 0.2))
    eosin = eosin_ratios(planes, od)
    red, median = _red_strokes(
        open_disk(colours["red"], _MIN_STROKE_UM / 2 / mpp), od, mpp=mpp, params=params, eosin=eosin
    )
    # growth stops where the colour stops being the strokes' own: their hue, and a red absorption
    # nearer the strokes' than the slide's own eosin (the stroma beside a stroke is eosin)
    faint_red &= _stroke_hue(hue, red)
    if red.any():
        tissue = eosin.median if eosin else _EOSIN_RATIO
        faint_red &= red_od_ratio(od) <= median + _GROW_TOWARD_EOSIN * (tissue - median)
    red_like = colours["red"] | faint_red
    black = open_disk(colours["black"], _MIN_BLACK_STROKE_UM / 2 / mpp)
    other = colours["green"] | colours["blue"] | colours["red"]  # a green stroke over tissue adds no grey
    found = {
        "green": open_disk(colours["green"], _MIN_STROKE_UM / 2 / mpp),
        "blue": open_disk(colours["blue"], _MIN_STROKE_UM / 2 / mpp),
        # a stroke's faint end over tissue lies on its line, past where the stroke's dense part stops
        "red": continued_red(_grown_red(red, red_like, od, mpp, eosin), red_like, od, mpp, eosin),
        # dyes and brown marker share their colour with DAB and pigment: only bands (strokes) are ink, and
        # brown only on a slide stained with eosin (H&E): on one without (IHC), brown is the DAB stain
        "brown": bands(open_disk(colours["brown"], _MIN_STROKE_UM / 2 / mpp), mpp, BROWN_BAND)
        if eosin is not None
        else np.zeros_like(colours["brown"]),
        "yellow": bands(open_disk(colours["yellow"], _MIN_STROKE_UM / 2 / mpp), mpp, DYE_BAND),
        # faint black is grey or brownish, never the purple of nuclei: it may follow a stroke all along;
        # translucent grey or purple-black marker, as dark as dense nuclei, only as a long band
        "black": _grown(black, colours["black"] | faint_black, mpp, None)
        | grey_bands(planes, od, mpp, coloured=other, lines=lines),
    }
    # a purple-black stroke's inside, as dark as a fold, joined to its black edges and dots
    found["black"] |= stroke_inside(found["black"], val, sat, mpp, exclude=other | _none(lines))
    found = {name: m if name in params.ink_colours else np.zeros_like(m) for name, m in found.items()}
    grown = np.logical_or.reduce(list(found.values()))
    if exclude is not None:
        grown &= ~exclude
    out = np.zeros(grown.shape, np.uint8)
    if not grown.any():
        return out
    grown = close_disk(grown, STREAK_GAP_UM / 2 / mpp)
    grown = remove_small_objects(grown, max_size=int(_MIN_REGION_UM2 / (mpp * mpp)))
    for name in INK_COLOURS:
        out[found[name] & grown] = colour_code(name)
    gaps = grown & (out == 0)
    if gaps.any():  # a closed gap takes the colour of a stroke it joins (within the closing's reach)
        reach = 2 * int(np.ceil(STREAK_GAP_UM / 2 / mpp)) + 1
        out[gaps] = ndimage.grey_dilation(out, size=(reach, reach))[gaps]
    return out


#: a red stroke grows only into pixels within this many degrees of hue of the strokes' own median: a
#: marker's faint streaks keep its hue (HistoQC's red pen: 335-357 degrees, median 348), eosin-rich stroma
#: beside a red (0-10 degree) stroke is pinker (330-345); 12 degrees lost HistoQC's streaks over tissue
_STROKE_HUE_DEG = 18.0
#: a slide whose eosin cannot be measured (too little of it) is taken to absorb red light like this
#: (OD_R / OD_G; Macenko et al.'s reference eosin vector: 0.27)
_EOSIN_RATIO = 0.27
#: ... and a faint red pixel joins a stroke only while its ratio lies under this share of the way from
#: the strokes' own (median) to the slide's eosin (median): a streak of marker over tissue mixes the two
#: (0.5 lost 5-9 of the tiles of HistoQC's red streaks over tissue; 0.7 keeps them)
_GROW_TOWARD_EOSIN = 0.7
#: a sure red stroke (its pieces a gap apart taken together) has at least this many dense pixels: a
#: pixel or two of blood in a vessel, or of eosin in a JPEG thumbnail, reach a marker's ratio by noise
#: alone (TUPAC thumbnails: specks with 0-2 dense pixels at 0.09-0.15; HistoQC's red strokes: 8-8,000)
_MIN_DENSE = 4
#: a red region absorbing this little red light is marker or dye whatever its shape (marker 0.09-0.14
#: over glass); between this and the limit (where haemorrhage has been measured, 0.13-0.20) only a
#: stroke-shaped region is (`strokes.RED_BAND`), or one at least this far under the slide's own eosin
#: (its 10th percentile: blood absorbs like eosin, so a part this far under it is no blood; HistoQC's
#: broken red strokes over tissue, 0.15-0.19 on a slide whose eosin starts at 0.28)
_STRONG_RATIO = 0.125
_EOSIN_GAP = 0.06


def _stroke_hue(hue: np.ndarray, strokes: np.ndarray) -> np.ndarray:
    """(h, w) bool: pixels whose hue is within _STROKE_HUE_DEG of the median hue of the `strokes`
    (measured around 0 degrees, where red wraps); all False when there is no stroke."""
    if not strokes.any():
        return np.zeros(hue.shape, bool)
    centred = (hue + 180.0) % 360.0 - 180.0  # red near 0, eosin near -25
    median = float(np.median(centred[strokes]))
    return np.abs(centred - median) <= _STROKE_HUE_DEG


def _red_strokes(
    parts: np.ndarray, od: np.ndarray, *, mpp: float, params: ArtifactParams, eosin: EosinRatios | None
) -> tuple[np.ndarray, float]:
    """(the red `parts` that are marker, their median OD_R / OD_G): sure strokes by their own optical
    density (under the limit and under the slide's own eosin), size and shape, and the parts next to
    them where a stroke goes over tissue."""
    ratio, dense = red_od_ratio(od), od[..., 1] >= RED_DENSE_OD
    # a stroke drawn up to a pool of blood is one red region with it: parted where the pixels absorb
    # more red light than marker over tissue does, so that each part is judged on its own
    near_ratio = min(_NEAR_RATIO, eosin.low) if eosin is not None else _NEAR_RATIO
    parts = parts & ~(dense & (ratio > near_ratio))
    limit = params.red_max_od_ratio if eosin is None else min(params.red_max_od_ratio, eosin.low)
    labels = label(parts, connectivity=2)
    medians, counts = _region_medians(labels, ratio, dense)
    # size and shape are the stroke's: a drying marker breaks into pieces a gap apart
    groups, width, elongation = region_shapes(close_disk(parts, STREAK_GAP_UM / 2 / mpp), mpp, RED_BAND)
    group = np.zeros(len(medians), np.int64)
    group[labels[parts]] = groups[parts]
    shaped = (width >= RED_BAND.min_width_um) & (elongation >= RED_BAND.min_elongation)
    in_group = np.bincount(group, weights=counts, minlength=len(width))  # dense pixels per group
    big = in_group >= _MIN_DENSE
    bound = medians + median_margin(counts)
    # under the limit, a part is marker when it absorbs far less red light than any blood could (strong),
    # or far less than the slide's own eosin (which blood absorbs like), or when its stroke is a band
    unlike_eosin = bound <= (eosin.low - _EOSIN_GAP if eosin is not None else 0.0)
    keep = (bound <= limit) & big[group] & ((bound <= _STRONG_RATIO) | unlike_eosin | shaped[group])
    keep[0] = False
    sure = keep[labels]
    if not sure.any():
        return sure, 0.0
    median = float(np.median(ratio[sure & dense]))
    if params.red_max_od_ratio >= _NEAR_RATIO:
        return sure, median
    near = (medians <= near_ratio) & (counts > 0) & ~keep
    near[0] = False
    near_parts = near[labels]
    return sure | (_touching(near_parts | dilate_disk(sure, _NEAR_UM / mpp), sure) & near_parts), median


def _region_medians(
    labels: np.ndarray, ratio: np.ndarray, dense: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """((n + 1,) median `ratio` over each labelled region's `dense` pixels (inf: none; the mean of the two
    middle values for an even count, as np.median), (n + 1,) their count). One sort of the dense pixels
    by region, then value: ndimage.median's per-label selection cost 70 ms on a thumbnail of many specks."""
    n = int(labels.max())
    region, value = labels[dense], ratio[dense]
    inside = region > 0
    region, value = region[inside], value[inside]
    counts = np.bincount(region, minlength=n + 1)
    medians = np.full(n + 1, np.inf)
    has = np.flatnonzero(counts)
    if len(has):
        ranked = value[np.lexsort((value, region))].astype(np.float64)
        start = np.cumsum(counts) - counts
        lo = start[has] + (counts[has] - 1) // 2
        hi = start[has] + counts[has] // 2
        medians[has] = (ranked[lo] + ranked[hi]) / 2.0
    return medians, counts


def _grown_red(
    seeds: np.ndarray, candidates: np.ndarray, od: np.ndarray, mpp: float, eosin: EosinRatios | None
) -> np.ndarray:
    """The red `seeds` grown into the `candidates` within _GROW_UM of them (`_grown`), each grown part
    (a connected part of the candidates outside the seeds) judged on its own: one whose dense pixels'
    median OD_R / OD_G reaches the slide's own eosin (its 10th percentile) absorbs like that eosin, and
    is the tissue beside the stroke, not the stroke's faint edge (HistoQC's red streaks over tissue:
    their parts' medians 0.13-0.28 on a slide whose eosin starts at 0.28, 0.17-0.26 at 0.27). The parts
    left join the stroke across gaps of STREAK_GAP_UM (a drying marker's streaks)."""
    if not seeds.any():
        return seeds
    candidates = candidates & dilate_disk(seeds, _GROW_UM / mpp)
    if eosin is not None:
        parts = label(candidates & ~seeds, connectivity=2)
        dense = candidates & (od[..., 1] >= RED_DENSE_OD)
        medians, counts = _region_medians(parts, red_od_ratio(od), dense)
        eosin_like = (medians >= eosin.low) & (counts >= _MIN_DENSE)
        eosin_like[0] = False
        candidates = candidates & ~eosin_like[parts]
    # a drying marker's streaks lie a gap apart: they join the stroke together
    bridged = close_disk(candidates, STREAK_GAP_UM / 2 / mpp) | seeds
    return _touching(bridged, seeds) & (candidates | seeds)


def _grown(seeds: np.ndarray, candidates: np.ndarray, mpp: float, reach_um: float | None) -> np.ndarray:
    """`seeds` with the parts of `candidates` that touch them (within `reach_um` of them; None: any)."""
    if not seeds.any():
        return seeds
    if reach_um is not None:
        candidates = candidates & dilate_disk(seeds, reach_um / mpp)
    return _touching(candidates, seeds)


def _none(mask: np.ndarray | None) -> np.ndarray | bool:
    """`mask`, or False (nothing) when None."""
    return False if mask is None else mask


def _touching(candidates: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """The connected parts of `candidates` (8-connected) that hold at least one seed pixel."""
    labels = label(candidates | seeds, connectivity=2)
    keep = np.zeros(int(labels.max()) + 1, bool)
    keep[labels[seeds]] = True
    keep[0] = False
    return keep[labels]

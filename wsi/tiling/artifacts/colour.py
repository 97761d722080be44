"""Per-pixel colour rules for marker ink, in HSV, and the optical-density ratio that tells red marker
from blood and eosin: cheap enough to run on every tile.

Hue finds the candidates; it cannot decide alone. Rules of our own, after reading three detectors:
- histolab (histolab/histolab @202a8bca, src/histolab/filters/image_filters_functional.py:
  green_pen_filter, blue_pen_filter, red_pen_filter) ORs a dozen RGB boxes per colour
  (e.g. red: R > 150, G < 80, B < 90), which blood and eosin-rich muscle fall into as well.
- HistoQC (choosehappy/HistoQC @b7956129, histoqc/ClassificationModule.py byExampleWithFeatures with
  config pen_markings) trains a per-pixel classifier on example masks (those in ../shared/data/artifacts),
  i.e. needs its training images at run time; we use those masks only to choose and test thresholds.
- PenAnnotationExtractor (MSKCC-Computational-Pathology/PenAnnotationExtractor @83a91207,
  penAnnotationExtractor.py) takes black as HSV value <= 125/255 and blue/green as saturated hue bands,
  and has no red rule at all: its slides (and many labs') use black, blue and green markers.
Hue separates green and blue ink from both H&E stains: eosin is pink-magenta (300-345 degrees),
haematoxylin purple (260-330), DAB brown (10-40). Red and black ink share their hue with tissue:
blood, eosin-rich stroma and muscle are as red as a red marker; dense nuclei, folds and pigment as dark
as a black one. What separates them is how they absorb (Beer-Lambert: optical density OD = -log10 of
the transmitted light, per channel, adds up over what the light passes through):
- every H&E pixel is a non-negative mix of haematoxylin and eosin, and both absorb some red light, so
  its red OD is a sizeable share of its green OD: OD_R / OD_G >= the eosin vector's own (0.27 in
  Macenko et al.'s reference H&E vectors, 0.21-0.33 measured on blood, muscle and eosin-rich stroma in
  ../shared/data/artifacts and 40 MSKCC slides). A red marker's dye passes red light almost untouched:
  0.09-0.18 over glass (HistoQC's and histolab's red-pen slides). `red_od_ratio` is that ratio.
Black marker is told from dense nuclei, folds and pigment by darkness and stroke width in
`wsi.tiling.artifacts.ink`, not by colour: a neutral-density test (smallest channel OD over largest) was
measured and dropped, because markers sold as black are often purple-black (0.40-0.70 on histolab's
diagnostic-slide thumbnail, against 0.55-0.80 on dark tissue).
Single pixels are noisy (and a pale pixel's ratio is mostly noise), so the ratio is judged as the median
over a region's or a tile's red pixels dense enough to measure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wsi.tiling.params import INK_COLOURS, ArtifactParams


def colour_code(name: str) -> int:
    """The code of an ink colour in per-tile records and colour maps: 1 + its index in INK_COLOURS (0:
    no ink, or not known)."""
    return INK_COLOURS.index(name) + 1


#: (hue degrees, saturation, value) planes of an image, float32
HSV = tuple[np.ndarray, np.ndarray, np.ndarray]
#: a red candidate's signature is measured where its green OD is at least this (transmission <= 32%):
#: paler pixels' red OD is a few grey levels, as much JPEG noise as absorption
RED_DENSE_OD = 0.5
#: spread (sd) of the ratio over the pixels of one region, blood or marker alike (measured 0.04-0.06)
SIGNATURE_SD = 0.05


def median_margin(n: np.ndarray | int) -> np.ndarray:
    """Margin of the median of `n` pixels' signature toward tissue: half its standard error (1.2533 sd /
    sqrt(n) for a normal spread; a one-sided 69% bound). A speck of 6 pixels of blood at 0.18 is 0.193,
    no marker; a stroke of hundreds of pixels is judged on its median. (Chosen on CAMELYON16's Tumor_004,
    whose 6-pixel vessel at 0.183 was the one blood region under 0.19; a full 95% bound, 1.645 standard
    errors, also dropped a tenth of the small streaks of HistoQC's red strokes.)
    """
    return np.asarray(0.5 * 1.2533 * SIGNATURE_SD / np.sqrt(np.maximum(n, 1)))


def hsv(rgb: np.ndarray) -> HSV:
    """Hue (degrees, 0-360), saturation and value (0-1) of (..., 3) uint8 pixels, float32.

    Our own float32 version: skimage's rgb2hsv works in float64 and costs ~4x more per tile. The three
    channels are taken apart into contiguous planes first (each operation then runs over contiguous
    memory: 1.5-2.5x faster than on the interleaved channels). A grey pixel (span 0) needs no case of its
    own: its hue is (g - b) / 1 = 0 and its saturation 0 / max(high, 1) = 0."""
    r, g, b = np.moveaxis(rgb[..., :3], -1, 0).astype(np.float32, order="C")
    high = np.maximum(np.maximum(r, g), b)
    span = high - np.minimum(np.minimum(r, g), b)
    safe = np.where(span > 0, span, np.float32(1.0))
    hue = np.where(high == r, (g - b) / safe, np.where(high == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe))
    hue *= np.float32(60.0)  # in [-60, 300]: `% 360` only adds 360 to the negative ones (10x its cost)
    np.add(hue, np.float32(360.0), out=hue, where=hue < 0)
    sat = span / np.maximum(high, np.float32(1.0))
    return hue, sat, high / np.float32(255.0)


def optical_density(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) float32 OD = -log10(I / 255) of (..., 3) pixels (0-255; 0 taken as 1: OD <= 2.4)."""
    px = np.maximum(rgb[..., :3].astype(np.float32), 1.0)
    return (np.log10(np.float32(255.0)) - np.log10(px)).astype(np.float32)


def red_od_ratio(od: np.ndarray) -> np.ndarray:
    """(...) OD_R / OD_G: ~0.1 for a red marker, >= ~0.21 for anything stained with H&E (blood included)."""
    return od[..., 0] / np.maximum(od[..., 1], 1e-3)


def ink_pixels(rgb: np.ndarray, params: ArtifactParams) -> dict[str, np.ndarray]:
    """Colour -> (...) bool mask of pixels of (..., 3) uint8 `rgb` whose colour could be that ink (red:
    candidates, see `ink_rules`)."""
    return ink_rules(hsv(rgb), params)


def ink_rules(planes: HSV, params: ArtifactParams) -> dict[str, np.ndarray]:
    """Colour -> bool mask of the pixels of an image's HSV `planes` whose colour could be that ink.

    Green, blue and black are ink by colour here (black strokes must also be wide:
    `wsi.tiling.artifacts.ink`). Red are candidates: blood and eosin take that colour too, and a red pixel is
    ink only when its region's (or tile's) optical density says marker."""
    hue, sat, val = planes
    p = params
    lit = val >= 0.15  # hue of near-black pixels is noise
    green = lit & (hue >= p.green_hue[0]) & (hue <= p.green_hue[1]) & (sat >= p.green_min_saturation)
    blue = lit & (hue > p.blue_hue[0]) & (hue <= p.blue_hue[1]) & (sat >= p.blue_min_saturation)
    # translucent blue marker over tissue: bright, moderately saturated, hue pulled toward purple
    blue |= (
        (hue > p.blue_hue[0]) & (hue <= p.blue_pale_hue_max) & (sat >= p.blue_pale_min_saturation)
        & (val >= p.blue_pale_min_value)
    )  # fmt: skip
    red = lit & ((hue >= p.red_hue_min) | (hue <= p.red_hue_max)) & (sat >= p.red_min_saturation)
    black = val <= p.black_max_value
    if black.any():  # few pixels: the logarithms only of those
        at = np.nonzero(black)
        black[at] = ~thick_stain(hue[at], sat[at], val[at])
    return {"green": green, "blue": blue, "red": red, "black": black}


#: Black and grey marker absorb the three colours about alike: the least channel's optical density is at
#: least 0.40 of the largest (purple-black marker on histolab's diagnostic-slide thumbnail: 0.40-0.70;
#: the dark pixels of HistoQC's and MSKCC's black strokes: 0.67-1.0, 5th percentile). Stain lying thick,
#: two layers of a fold or a densely stained biopsy piece, keeps the stains' purple-to-pink hue and absorbs
#: red and blue light far less than green (a fold of FolDet's oesophagus, benchmarks/images: 0.27-0.33):
#: a dark pixel of that hue under STAIN_MIN_EVEN is stain, never black marker. (A dark pixel of a marker's
#: hue, green or blue, stays black ink: under value 0.15 its hue is not trusted as green or blue.)
STAIN_HUES = (250.0, 345.0)
STAIN_MIN_EVEN = 0.35


def thick_stain(hue: np.ndarray, sat: np.ndarray, val: np.ndarray) -> np.ndarray:
    """bool per pixel (HSV planes): of the stains' hue and absorbing unevenly, its least channel OD under
    STAIN_MIN_EVEN of its largest (OD = -log of the largest channel, `val`, and of the least, val * (1 -
    sat))."""
    least = np.maximum(val * (1.0 - sat), np.float32(1.0 / 255.0))
    uneven = np.log(np.maximum(val, np.float32(1.0 / 255.0))) > STAIN_MIN_EVEN * np.log(least)
    return uneven & (hue > STAIN_HUES[0]) & (hue < STAIN_HUES[1])


#: brown marker: orange-brown (hue 5-45 degrees), moderately saturated, and absorbing blue light more than
#: green (OD_B >= OD_G), which no H&E stain does (eosin 0.1, haematoxylin 0.4, measured 0.65-0.85 on
#: H&E tissue, 1.1-1.4 on brown marker); DAB, haemosiderin and melanin do, so only stroke-shaped
#: regions count (`wsi.tiling.artifacts.strokes`), and only on the thumbnail, never per tile pixel
BROWN_HUES = (5.0, 45.0)
BROWN_MIN_SATURATION = 0.25
BROWN_MIN_OD = 0.15  # green OD: a brown marker's paler streaks are still this dense
#: yellow tissue-marking dye: hue 45-70 degrees at saturation >= 0.3, absorbing blue light far more than
#: green (OD_B >= 1.5 OD_G); as brown, a band on the thumbnail
YELLOW_HUES = (45.0, 70.0)
YELLOW_MIN_SATURATION = 0.3


def dye_rules(planes: HSV, od: np.ndarray) -> dict[str, np.ndarray]:
    """Colour -> bool mask of the pixels of an image's HSV `planes` and (..., 3) optical density `od` whose
    colour could be brown marker or yellow dye (candidates: only stroke-shaped regions of them are)."""
    hue, sat, _ = planes
    blue_over_green = od[..., 2] / np.maximum(od[..., 1], 1e-3)
    brown = (hue >= BROWN_HUES[0]) & (hue < BROWN_HUES[1]) & (sat >= BROWN_MIN_SATURATION)
    brown &= (blue_over_green >= 1.0) & (od[..., 1] >= BROWN_MIN_OD)
    yellow = (hue >= YELLOW_HUES[0]) & (hue < YELLOW_HUES[1]) & (sat >= YELLOW_MIN_SATURATION)
    yellow &= blue_over_green >= 1.5
    return {"brown": brown, "yellow": yellow}


@dataclass(frozen=True)
class EosinRatios:
    """A slide's own eosin: OD_R / OD_G of its eosin-hued, stained pixels (`eosin_ratios`)."""

    low: float  # the 10th percentile: the least red light any of its eosin absorbs
    median: float


#: eosin's hue (degrees) and the least saturation and green OD of a pixel measured as the slide's eosin
EOSIN_HUES = (300.0, 342.0)
EOSIN_MIN_SATURATION = 0.2
EOSIN_MIN_OD = 0.3
#: ... and how many such pixels make a measure (else None)
EOSIN_MIN_PIXELS = 200


def eosin_ratios(planes: HSV, od: np.ndarray) -> EosinRatios | None:
    """The slide's own eosin (`EosinRatios`) from a thumbnail's HSV `planes` and (h, w, 3) `od`; None when
    under EOSIN_MIN_PIXELS pixels are eosin (a slide without H&E, or all marker)."""
    hue, sat, _ = planes
    pink = (hue >= EOSIN_HUES[0]) & (hue < EOSIN_HUES[1]) & (sat >= EOSIN_MIN_SATURATION)
    pink &= od[..., 1] >= EOSIN_MIN_OD
    if np.count_nonzero(pink) < EOSIN_MIN_PIXELS:
        return None
    low, median = np.percentile(red_od_ratio(od[pink]), [10, 50])
    return EosinRatios(low=float(low), median=float(median))


#: a tile's ink share is measured on every `TILE_STRIDE`-th pixel in each direction (1/64 of them):
#: 1,024 samples of a 256 px tile give its share to about 1% (binomial sd near the 10% threshold), at a
#: fifth of the cost of 1/16 (measured 0.1 vs 0.48 ms per tile, against ~1.4 ms for the background
#: and blur filters)
TILE_STRIDE = 8


def tile_ink_share(tiles: np.ndarray, params: ArtifactParams) -> np.ndarray:
    """(B,) share of ink pixels of (B, P, P, 3) uint8 tiles (sampled every TILE_STRIDE pixels).

    Green, blue and black pixels count as they are; a tile's red pixels count only when their median
    optical-density ratio over the dense ones says marker (`is_red_ink`), as for a thumbnail region."""
    return sample_ink_share(ink_sample(tiles), params)


def ink_sample(tiles: np.ndarray) -> np.ndarray:
    """(B, n, 3): the pixels of (B, P, P, 3) tiles that `tile_ink_share` looks at (every TILE_STRIDE-th
    of every TILE_STRIDE-th row; the rows first: one strided copy of whole rows, then a small one)."""
    rows = np.ascontiguousarray(tiles[:, ::TILE_STRIDE])
    return rows[:, :, ::TILE_STRIDE].reshape(len(tiles), -1, tiles.shape[-1])


def sample_ink_share(sample: np.ndarray, params: ArtifactParams) -> np.ndarray:
    """`tile_ink_share` of tiles' (B, n, 3) `ink_sample`."""
    return sample_ink(sample, params)[0]


def sample_ink(sample: np.ndarray, params: ArtifactParams) -> tuple[np.ndarray, np.ndarray]:
    """((B,) ink share, (B,) uint8 colour code of the most of it: `colour_code`, 0 where none) of tiles'
    (B, n, 3) `ink_sample`, counting the colours in params.ink_colours that have a per-pixel rule (green,
    blue, red, black; brown and yellow only as thumbnail strokes)."""
    colours = ink_pixels(sample, params)
    wanted: list[str] = [c for c in ("green", "blue", "black") if c in params.ink_colours]
    red = colours["red"] if "red" in params.ink_colours else None
    if red is not None:
        rows = np.flatnonzero(red.any(axis=1))  # only tiles with red pixels need their optical density
        marker = np.zeros(len(sample), bool)
        if len(rows):
            marker[rows] = _red_marker_rows(sample[rows], red[rows], params)
        colours["red"] = red & marker[:, None]
        wanted.append("red")
    counts = np.stack([np.count_nonzero(colours[c], axis=1) for c in wanted], axis=1) if wanted else None
    if counts is None:
        return np.zeros(len(sample)), np.zeros(len(sample), np.uint8)
    ink = np.logical_or.reduce([colours[c] for c in wanted])
    share = np.count_nonzero(ink, axis=1) / max(1, ink.shape[1])
    codes = np.asarray([colour_code(c) for c in wanted], np.uint8)[np.argmax(counts, axis=1)]
    return share, np.where(counts.max(axis=1) > 0, codes, 0).astype(np.uint8)


def is_red_ink(od: np.ndarray, candidates: np.ndarray, params: ArtifactParams) -> np.ndarray:
    """(B,) bool per row of (B, n, 3) `od`: its (B, n) red `candidates` are marker (the median OD_R / OD_G
    of the dense ones, moved up by `median_margin`, at most params.red_max_od_ratio)."""
    dense = candidates & (od[..., 1] >= RED_DENSE_OD)
    bound = _row_median(red_od_ratio(od), dense) + median_margin(dense.sum(axis=1))
    return np.asarray(bound <= params.red_max_od_ratio)


def _red_marker_rows(sample: np.ndarray, candidates: np.ndarray, params: ArtifactParams) -> np.ndarray:
    """`is_red_ink(optical_density(sample), candidates, params)`, with the optical density taken of the
    candidates alone (a few of a tile's pixels; the logarithm of all of them was 40% of the ink share's
    cost) and each row's median as np.nanmedian gives it (float32, the mean of the two middle values)."""
    row, col = np.nonzero(candidates)
    od = optical_density(sample[row, col])  # (c, 3)
    dense = od[:, 1] >= RED_DENSE_OD
    row, ratio = row[dense], red_od_ratio(od[dense])
    counts = np.bincount(row, minlength=len(sample))
    median = np.full(len(sample), np.nan, np.float32)
    has = np.flatnonzero(counts)
    if len(has):
        ranked = ratio[np.lexsort((ratio, row))]  # by row, then by value
        start = np.cumsum(counts) - counts
        lo = start[has] + (counts[has] - 1) // 2
        hi = start[has] + counts[has] // 2
        median[has] = (ranked[lo] + ranked[hi]) / np.float32(2.0)
    bound = median + median_margin(counts)
    return np.asarray(bound <= params.red_max_od_ratio)


def _row_median(values: np.ndarray, use: np.ndarray) -> np.ndarray:
    """(B,) median of each row's (B, n) `values` where `use`; NaN for a row with none (compares False)."""
    masked = np.where(use, values, np.nan)
    out = np.full(len(values), np.nan, np.float32)
    rows = use.any(axis=1)
    if rows.any():
        out[rows] = np.nanmedian(masked[rows], axis=1)
    return out


def ink_mask(rgb: np.ndarray, params: ArtifactParams) -> np.ndarray:
    """(...) bool: pixels whose colour could be any ink (red candidates before their density test)."""
    masks = ink_pixels(rgb, params)
    return masks["green"] | masks["blue"] | masks["red"] | masks["black"]

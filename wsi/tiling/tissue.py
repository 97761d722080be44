"""Tissue mask from a low-resolution thumbnail: HSV saturation, Otsu threshold, morphological cleanup.

Stained tissue is saturated and glass is grey-white, so saturation separates them on any scanner's
white balance; Otsu picks the split per slide, with a floor so that a blank slide yields no tissue.
Sizes are in micrometres and converted with the thumbnail's resolution, so the result does not depend
on the thumbnail size chosen.

Marker ink and tissue-marking dye take no part in setting the split (`marker_colours`): strongly
coloured blue, green or brown loops drawn over much of a section make a third, far more saturated mode
that pulls Otsu's threshold up until pale stroma falls under it (a real breast slide lost 38% of its
tissue cells that way). Those pixels are left out of the statistics, not out of the mask: tissue under a
stroke is still tissue, and the ink filter (`wsi.tiling.artifacts`) judges it. What coloured area the mask
leaves out, and why (judged glass, marker colour, removed as debris), is counted (`left_out`).

A dark-background (fluorescence-like) slide is the other way round: tissue is what shines, so there the
split is on brightness: the brightest channel above the background's own noise level (`wsi.tiling.dark_noise`:
mode + `dark_noise_sigmas` sigma), not a fixed level, so a dim TRITC scan keeps its faint tissue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from skimage.filters import threshold_otsu

from wsi.tiling.dark_noise import dark_noise
from wsi.tiling.morphology import closing, disk, label, opening, remove_small_holes, remove_small_objects
from wsi.tiling.params import TissueParams


def saturation(rgb: np.ndarray) -> np.ndarray:
    """HSV saturation (max - min) / max of an (H, W, 3) uint8 image, as float32 in [0, 1]."""
    high = _max_rgb(rgb).astype(np.float32)
    low = np.minimum(np.minimum(rgb[..., 0], rgb[..., 1]), rgb[..., 2]).astype(np.float32)
    return np.divide(high - low, high, out=np.zeros_like(high), where=high > 0)


def _max_rgb(rgb: np.ndarray) -> np.ndarray:
    # two np.maximum calls: `.max(axis=-1)` over a length-3 axis is ~40x slower
    return np.maximum(np.maximum(rgb[..., 0], rgb[..., 1]), rgb[..., 2])


#: pixels at least this saturated whose hue no H&E or IHC stain has (haematoxylin 230-330 degrees,
#: eosin 300-345, DAB 10-40, blood 340-15) are marker or dye: green, teal, cyan, blue (60-228 degrees;
#: IHC's pale haematoxylin sits at ~235 under 0.35) and yellow dye
MARKER_MIN_SATURATION = 0.3
MARKER_HUES = (45.0, 228.0)
#: vivid blue marker reaches into haematoxylin's hues (228-260 degrees) at a saturation no stain has
VIVID_BLUE_SATURATION = 0.5
VIVID_BLUE_HUES = (228.0, 262.0)
#: brown and purple-black marker: dark (brightest channel at most this share of 255) and saturated;
#: DAB is as brown but brighter, dense nuclei as dark but purple (hue 260-330)
MARKER_DARK_VALUE = 0.5
MARKER_DARK_SATURATION = 0.35
MARKER_DARK_HUES = (10.0, 60.0)
#: red marker, and blood as saturated as it: neither votes on the split (both stay in the mask, being
#: far over any split; the ink filter tells them apart)
RED_SATURATION = 0.6
RED_HUES = (342.0, 15.0)  # from, through 0, to
#: black marker, labels and debris: brightest channel at most this share of 255 (nuclei stay above ~0.3)
BLACK_VALUE = 0.25
#: a pixel is "coloured" for the count of what the mask left out when at least this saturated
COLOURED_SATURATION = 0.1


@dataclass(frozen=True)
class LeftOut:
    """Coloured area of a thumbnail that the tissue mask left out, by why (mm^2), and the mask's own area.

    glass: under the saturation split (judged glass); ink: marker or dye colours (`marker_colours`);
    debris: over the split but removed by the cleanup as too small or too thin."""

    tissue_mm2: float = 0.0
    glass_mm2: float = 0.0
    ink_mm2: float = 0.0
    debris_mm2: float = 0.0

    @property
    def total_mm2(self) -> float:
        return self.glass_mm2 + self.ink_mm2 + self.debris_mm2

    def share(self, part: float) -> float:
        """`part` (mm^2) as a share of the tissue found plus what was left out."""
        whole = self.tissue_mm2 + self.total_mm2
        return part / whole if whole > 0 else 0.0

    def describe(self) -> str:
        """e.g. "1.2 mm2 coloured (3.4% of the tissue): 1 glass, 0.2 ink, 0 debris" (mm2 each)."""
        parts = ", ".join(
            f"{_mm2(v)} {name}"
            for name, v in (("glass", self.glass_mm2), ("ink", self.ink_mm2), ("debris", self.debris_mm2))
        )
        return (
            f"{_mm2(self.total_mm2)} mm2 coloured ({self.share(self.total_mm2):.1%} of the tissue): {parts}"
        )


def _mm2(value: float) -> str:
    return f"{value:.2g}" if value < 10 else f"{value:.0f}"


@dataclass(frozen=True)
class TissueFinding:
    """The tissue mask and what made it: the pixels over the split before cleanup (`raw`) and those
    left out of the split's statistics as marker colours (`marker`; None on a dark slide)."""

    mask: np.ndarray
    raw: np.ndarray
    marker: np.ndarray | None = None
    threshold: float = 0.0


def tissue_mask(
    rgb: np.ndarray, *, mpp: float, params: TissueParams | None = None, dark: bool = False
) -> np.ndarray:
    """Boolean (H, W) tissue mask of an (H, W, 3) uint8 thumbnail at `mpp` um/px.

    dark: the slide has a dark background (fluorescence-like, `wsi.tiling.background`): tissue is bright.
    """
    return find_tissue_mask(rgb, mpp=mpp, params=params, dark=dark).mask


def find_tissue_mask(
    rgb: np.ndarray, *, mpp: float, params: TissueParams | None = None, dark: bool = False
) -> TissueFinding:
    """`tissue_mask` with what made it (`TissueFinding`), for the count of what it left out."""
    params = params or TissueParams()
    if rgb.ndim != 3 or rgb.shape[2] < 3:
        raise ValueError(f"expected an (H, W, 3) RGB thumbnail, got shape {rgb.shape}")
    if dark:
        raw = _bright_pixels(rgb, params)
        return TissueFinding(_clean(raw, mpp, params), raw)
    marker = marker_colours(rgb)
    raw, threshold = _saturated_split(rgb, params, exclude=marker)
    raw = _with_pale_edges(rgb, raw, threshold, params, exclude=marker)
    return TissueFinding(_clean(raw, mpp, params), raw, marker, threshold)


#: pale tissue joined to tissue over the split is tissue down to this share of the split ...
PALE_SHARE = 0.5
#: ... and at least this far over the glass's own saturation (the median of the pixels under the split)
GLASS_MARGIN = 0.04
#: ... and not near-black (brightest channel at least this, 0-255: a saturation of noise)
PALE_MIN_BRIGHTNESS = 64
#: ... and of a stain's hue (haematoxylin and eosin: purple through pink to red, from this through 0 to
#: that): the grey band of a coverslip edge is blue-grey or brownish
PALE_HUES = (250.0, 20.0)


def _with_pale_edges(
    rgb: np.ndarray, over: np.ndarray, threshold: float, params: TissueParams, exclude: np.ndarray
) -> np.ndarray:
    """`over` (the pixels over the split) with the paler pixels connected to them (hysteresis, as in
    Canny's edge linking): the alveolar walls of lacy lung, loose stroma and fat septa sit between the
    glass and a split that dense tumour has pulled up, and are tissue where they join it. The low level
    is PALE_SHARE of the split, never under min_saturation nor within GLASS_MARGIN of the glass."""
    if not over.any():
        return over
    high = _max_rgb(rgb)
    low_rgb = np.minimum(np.minimum(rgb[..., 0], rgb[..., 1]), rgb[..., 2])
    sat = _SATURATION[(high.astype(np.uint16) << 8) | low_rgb]
    usable = high > params.dark_level
    under = usable & ~over & ~exclude
    glass = float(np.median(sat[under])) if under.any() else 0.0
    level = max(params.min_saturation, PALE_SHARE * threshold, glass + GLASS_MARGIN)
    if level >= threshold:
        return over
    pale = (high >= PALE_MIN_BRIGHTNESS) & (sat > level)
    rows, cols = np.nonzero(pale)
    hue = _hue(rgb[rows, cols, :3].astype(np.float32))
    stain = (hue >= PALE_HUES[0]) | (hue < PALE_HUES[1])
    pale[rows[~stain], cols[~stain]] = False
    labels = label(pale | over, connectivity=2)
    keep = np.zeros(int(labels.max()) + 1, bool)
    keep[labels[over]] = True
    keep[0] = False
    return keep[labels]


def marker_colours(rgb: np.ndarray) -> np.ndarray:
    """(H, W) bool: pixels of an (H, W, 3) uint8 image in a colour that marker or dye gives and no stain
    does at that strength (blue, teal, green, yellow; dark brown; black; saturated red, which blood
    shares). Their hue is computed only
    where a pixel is saturated or dark enough to qualify (a few percent of most thumbnails)."""
    high = _max_rgb(rgb)
    low = np.minimum(np.minimum(rgb[..., 0], rgb[..., 1]), rgb[..., 2])
    sat = _SATURATION[(high.astype(np.uint16) << 8) | low]
    out = high <= round(BLACK_VALUE * 255)
    maybe = (sat >= min(MARKER_MIN_SATURATION, MARKER_DARK_SATURATION, RED_SATURATION)) & ~out
    rows, cols = np.nonzero(maybe)
    if len(rows):
        px = rgb[rows, cols, :3].astype(np.float32)
        hue = _hue(px)
        s, v = sat[rows, cols], high[rows, cols].astype(np.float32) / 255.0
        hit = (s >= MARKER_MIN_SATURATION) & (hue >= MARKER_HUES[0]) & (hue < MARKER_HUES[1])
        hit |= (
            (s >= MARKER_DARK_SATURATION) & (v <= MARKER_DARK_VALUE)
            & (hue >= MARKER_DARK_HUES[0]) & (hue < MARKER_DARK_HUES[1])
        )  # fmt: skip
        hit |= (s >= VIVID_BLUE_SATURATION) & (hue >= VIVID_BLUE_HUES[0]) & (hue < VIVID_BLUE_HUES[1])
        hit |= (s >= RED_SATURATION) & ((hue >= RED_HUES[0]) | (hue < RED_HUES[1]))
        out[rows[hit], cols[hit]] = True
    return out


def _hue(px: np.ndarray) -> np.ndarray:
    """(n,) HSV hue in degrees of (n, 3) float32 pixels (0 for grey)."""
    r, g, b = px[:, 0], px[:, 1], px[:, 2]
    high = np.maximum(np.maximum(r, g), b)
    span = high - np.minimum(np.minimum(r, g), b)
    safe = np.where(span > 0, span, 1.0)
    hue = np.where(high == r, (g - b) / safe, np.where(high == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe))
    hue = hue * np.float32(60.0)
    return np.where(hue < 0, hue + np.float32(360.0), hue)


def left_out(rgb: np.ndarray, finding: TissueFinding, *, mpp: float, params: TissueParams) -> LeftOut:
    """What coloured area (saturation >= COLOURED_SATURATION, not too dark to judge) of an (H, W, 3)
    thumbnail at `mpp` um/px the mask left out, and why (`LeftOut`)."""
    px_mm2 = (mpp / 1000.0) ** 2
    high = _max_rgb(rgb)
    low = np.minimum(np.minimum(rgb[..., 0], rgb[..., 1]), rgb[..., 2])
    coloured = (_SATURATION[(high.astype(np.uint16) << 8) | low] >= COLOURED_SATURATION) & (
        high > params.dark_level
    )
    outside = coloured & ~finding.mask
    ink = outside & finding.marker if finding.marker is not None else np.zeros_like(outside)
    debris = outside & finding.raw & ~ink
    glass = outside & ~ink & ~debris
    return LeftOut(
        tissue_mm2=float(np.count_nonzero(finding.mask)) * px_mm2,
        glass_mm2=float(np.count_nonzero(glass)) * px_mm2,
        ink_mm2=float(np.count_nonzero(ink)) * px_mm2,
        debris_mm2=float(np.count_nonzero(debris)) * px_mm2,
    )


def _saturated_pixels(rgb: np.ndarray, params: TissueParams) -> np.ndarray:
    """Stained pixels of a brightfield thumbnail: saturation above Otsu's split (floored), every
    pixel taking part in the split."""
    return _saturated_split(rgb, params)[0]


def _saturated_split(
    rgb: np.ndarray, params: TissueParams, exclude: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """(pixels over the split, the split): saturation above Otsu's split (floored) of the pixels
    brighter than dark_level and not in `exclude` (marker colours).

    A pixel's saturation depends only on its (brightest, darkest) channel pair, so it is computed once
    per pair (`_SATURATION`, the same float32 arithmetic as `saturation`) and Otsu's histogram is built
    from the pairs' counts: the same values, counts and threshold as `threshold_otsu(saturation(rgb)[usable])`
    (tests/wsi/tiling/test_tissue.py compares them), at a third of the cost on a 1,250 px thumbnail.
    """
    high = _max_rgb(rgb)
    low = np.minimum(np.minimum(rgb[..., 0], rgb[..., 1]), rgb[..., 2])
    pair = high.astype(np.uint16) << 8
    pair |= low  # (H, W) index of the (high, low) pair into the 65,536 entry tables
    usable = high > params.dark_level
    voters = usable & ~exclude if exclude is not None else usable
    counts = np.bincount(pair[voters], minlength=1 << 16)
    seen = np.flatnonzero(counts)
    threshold = params.min_saturation
    if len(seen) > 1:
        values = _SATURATION[seen]
        if float(values.max()) > float(values.min()):
            # np.histogram's bins of the pixels' values: those of the distinct values weighted by their counts
            hist, edges = np.histogram(values, bins=256, weights=counts[seen])
            centres = (edges[:-1] + edges[1:]) / 2.0
            threshold = max(threshold, float(threshold_otsu(hist=(hist, centres))))
    return (threshold < _SATURATION)[pair] & usable, threshold


def _saturation_table() -> np.ndarray:
    """(65,536,) float32 saturation of each (high << 8 | low) channel pair, as `saturation` computes it
    (pairs with low > high never occur)."""
    high = np.repeat(np.arange(256, dtype=np.float32), 256)
    low = np.tile(np.arange(256, dtype=np.float32), 256)
    return np.divide(high - low, high, out=np.zeros_like(high), where=high > 0)


_SATURATION = _saturation_table()
_SATURATION.setflags(write=False)  # a constant table, shared read-only


def _bright_pixels(rgb: np.ndarray, params: TissueParams) -> np.ndarray:
    """Pixels with signal on a dark-background thumbnail: brightest channel above the background's noise
    (`wsi.tiling.dark_noise`); a blank dark slide yields only specks of noise, which `_clean` removes."""
    high = _max_rgb(rgb)
    return high > dark_noise(high, k=params.dark_noise_sigmas).threshold


def _clean(mask: np.ndarray, mpp: float, params: TissueParams) -> np.ndarray:
    """Join fragments, drop dust and small regions, fill holes; sizes in micrometres."""
    px_area = mpp * mpp
    if params.closing_um > 0:
        mask = closing(mask, disk(max(1, round(params.closing_um / mpp))))
    if params.opening_um > 0 and round(params.opening_um / mpp) >= 1:
        mask = opening(mask, disk(round(params.opening_um / mpp)))
    if params.min_region_um2 > 0:
        mask = remove_small_objects(mask, max_size=math.floor(params.min_region_um2 / px_area))
    if params.max_hole_um2 > 0:
        mask = remove_small_holes(mask, max_size=math.floor(params.max_hole_um2 / px_area))
    return mask


def cell_fractions(mask: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Fraction of mask pixels inside each box.

    mask: (H, W) bool. boxes: (N, 4) float (x0, y0, x1, y1) in mask pixels, half-open; cut to the mask.
    Uses a summed-area table, so the cost is one pass over the mask plus O(1) per box.
    """
    h, w = mask.shape
    count = np.int32 if h * w < 2**31 else np.int64  # exact either way; int32 halves the memory traffic
    table = np.zeros((h + 1, w + 1), dtype=count)
    sums = table[1:, 1:]
    sums[...] = mask
    np.cumsum(sums, axis=0, out=sums)  # in place: 4x faster than cumsum(dtype=) of the bool mask
    np.cumsum(sums, axis=1, out=sums)
    x0 = np.clip(np.floor(boxes[:, 0] + 0.5).astype(np.int64), 0, w)
    y0 = np.clip(np.floor(boxes[:, 1] + 0.5).astype(np.int64), 0, h)
    x1 = np.clip(np.floor(boxes[:, 2] + 0.5).astype(np.int64), 0, w)
    y1 = np.clip(np.floor(boxes[:, 3] + 0.5).astype(np.int64), 0, h)
    x1 = np.maximum(x1, np.minimum(x0 + 1, w))  # a box smaller than a mask pixel still samples one
    y1 = np.maximum(y1, np.minimum(y0 + 1, h))
    inside = table[y1, x1] - table[y0, x1] - table[y1, x0] + table[y0, x0]
    area = np.maximum((x1 - x0) * (y1 - y0), 1)
    return inside / area

"""Translucent grey and purple-black marker: the marker colour that dense nuclei share.

Dark grey is ink only as a long band that absorbs the three colours alike (haematoxylin absorbs little
blue); over tissue, whose colour a translucent marker takes, grey marker is found by the even grey optical
density it adds to the stained tissue around it (Beer-Lambert: densities add; a fold or more stain adds
the stain's own colour). Used by `ink.ink_colour_regions` as its black ink.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from wsi.tiling.artifacts.colour import HSV
from wsi.tiling.artifacts.strokes import GREY_BAND, GREY_EXCESS_BAND, STREAK_GAP_UM, region_shapes
from wsi.tiling.morphology import block_reduce, close_disk, open_disk

#: translucent grey and purple-black marker: as dark (value <= 0.55) and as grey (saturation <= 0.35) as
#: dense haematoxylin, told from it only as a long even band (MSKCC's grey loops: 250-720 um wide, 5-40
#: times as long; no dark tissue region of the tuning images is such a band)
_GREY_MAX_VALUE = 0.55
_GREY_MAX_SATURATION = 0.35
#: ... of a purple-to-blue grey (MSKCC's: 277-308 degrees) or neutral; brown-grey is brown's (`dye_rules`)
_GREY_HUES = (200.0, 330.0)
_NEUTRAL_SATURATION = 0.12
#: ... and absorbing the three colours about alike: most of a band's dark grey pixels have their least
#: OD at least this share of their largest (MSKCC's grey loops: medians 0.73-0.80); dense nuclei absorb
#: little blue light (Ruifrok and Johnston's haematoxylin: 0.41; CAMELYON16's dark tumour: median 0.64)
_GREY_EVEN = 0.68
#: Grey marker drawn over tissue takes the tissue's colour (purple over a tumour: saturation 0.4, more
#: than _GREY_MAX_SATURATION), but what it adds is grey. Optical densities add (Beer-Lambert), so the
#: marker's own absorption is the pixel's OD less that of the tissue around it (the mean OD over
#: _SURROUND_UM): a grey marker adds about as much to each channel (MSKCC 00073's loop over tumour:
#: red / green 0.86-1.0, blue / green 0.7-0.85), where more haematoxylin adds little blue absorption
#: (Ruifrok and Johnston's H vector: blue / green 0.41) and more eosin little red (0.07), and a fold
#: adds the tissue's own colour (blue / green 0.5-0.6 measured beside the loop). Such an even grey excess
#: of at least _GREY_MIN_EXCESS green OD is grey marker where it forms a band (`strokes.GREY_BAND`).
_SURROUND_UM = 1500.0
_GREY_MIN_EXCESS = 0.1
_GREY_EXCESS_RED = 0.7
_GREY_EXCESS_BLUE = 0.65
#: a fine grey line over tissue is often broken (the marker skipped, or the tissue under it too pale to
#: add grey everywhere): pieces of grey excess up to this far apart (um) are measured as one band. Pieces
#: of one line lie along it, so joined they are a long band; pieces of dark tissue lie about, and joined
#: they are a blob. (Tuning images: 300 took 114 more of the black inked tiles and no ink-free tissue.
#: Joining dark grey pieces too took 181, but made bands of dense nuclei and of a coverslip's edge; with
#: those, 150 took 75 and 500 took 20 ink-free tissue tiles, of a lavender slide's brown-grey wedges.)
_JOIN_UM = 300.0
#: ... the surround being the tissue around a pixel: those of green OD at least this (glass: 0.01-0.05)
_STAINED_OD = 0.08


def grey_bands(
    planes: HSV, od: np.ndarray, mpp: float, *, coloured: np.ndarray, lines: np.ndarray | None = None
) -> np.ndarray:
    """(h, w) bool: dark grey or purple-black regions, or a grey excess over the tissue around them,
    shaped like a marker stroke (`strokes.GREY_BAND`), their streaks closed over. `coloured`: pixels of
    another ink's colour (a green stroke over tissue adds no grey); `lines`: the bubble filter's rims and
    coverslip edges, which add a grey too (refraction) and are that filter's."""
    hue, sat, val = planes
    dark = (val <= _GREY_MAX_VALUE) & (val > 0.1)
    if not dark.any():
        return dark
    grey = dark & (sat <= _GREY_MAX_SATURATION)
    grey &= ((hue >= _GREY_HUES[0]) & (hue <= _GREY_HUES[1])) | (sat <= _NEUTRAL_SATURATION)
    excess = grey_excess(od, mpp, dark & ~coloured & (~lines if lines is not None else True))
    # even: a grey excess, or a dark grey that absorbs all three colours alike
    even = excess.copy()
    px = od[grey]
    even[grey] |= px.min(axis=-1) >= _GREY_EVEN * px.max(axis=-1)
    grey |= excess
    closed = close_disk(open_disk(grey, STREAK_GAP_UM / 2 / mpp), STREAK_GAP_UM / 2 / mpp)
    if not closed.any():
        return closed
    # a band on its own, or a piece of a fine line broken into pieces: those joined across _JOIN_UM are
    # measured as one band (the pieces keep their own pixels; joining never loses a band on its own)
    joined, width, elongation = region_shapes(close_disk(closed, _JOIN_UM / 2 / mpp), mpp, GREY_EXCESS_BAND)
    joined[~closed] = 0
    pieces = region_shapes(closed, mpp, GREY_EXCESS_BAND)
    # only by the grey it adds: joined dark pieces would also be dense nuclei or a coverslip's edge
    return _bands(pieces, grey, even, excess) | _bands(
        (joined, width, elongation), grey, even, excess, dark=False
    )


def _bands(
    shapes: tuple[np.ndarray, np.ndarray, np.ndarray],
    grey: np.ndarray,
    even: np.ndarray,
    excess: np.ndarray,
    *,
    dark: bool = True,
) -> np.ndarray:
    """(h, w) bool: the regions of `shapes` (`strokes.region_shapes`) that are grey marker bands: wide dark
    grey bands (unless not `dark`) or thinner bands of grey excess, most of whose `grey` pixels are
    `even`."""
    labels, width, elongation = shapes
    n = len(width)
    counts = np.bincount(labels[grey], minlength=n)
    evenly = np.bincount(labels[even], minlength=n) >= 0.5 * counts
    # a grey excess is no tissue's colour: a thinner band that is mostly one is marker too
    wide = (width >= GREY_BAND.min_width_um) & (elongation >= GREY_BAND.min_elongation) & dark
    thin = (width >= GREY_EXCESS_BAND.min_width_um) & (elongation >= GREY_EXCESS_BAND.min_elongation)
    thin &= np.bincount(labels[excess], minlength=n) >= 0.5 * counts
    keep = (wide | thin) & evenly
    keep[0] = False
    return keep[labels]


def grey_excess(od: np.ndarray, mpp: float, where: np.ndarray) -> np.ndarray:
    """(h, w) bool: pixels of `where` whose optical density (the mean of their block of STREAK_GAP_UM: a
    marker's streaks and the tissue's texture smoothed) exceeds the mean of the _SURROUND_UM around them
    by an even grey (`_GREY_MIN_EXCESS`, `_GREY_EXCESS_RED`, `_GREY_EXCESS_BLUE`). The surround is
    measured on blocks of about a sixteenth of it (a mean over 1.5 mm needs no finer grid)."""
    out = np.zeros(od.shape[:2], bool)
    if not where.any():
        return out
    block = max(1, int(_SURROUND_UM / mpp / 16))
    coarse = block_reduce(od, block)  # (h', w', 3) float32
    stained = (coarse[..., 1] >= _STAINED_OD).astype(np.float32)  # the surround is tissue, not glass
    size = max(3, round(_SURROUND_UM / mpp / block) | 1)
    share = np.maximum(ndimage.uniform_filter(stained, size, mode="nearest"), 1e-3)
    rows, cols = np.nonzero(where)
    near = max(1, round(STREAK_GAP_UM / mpp))
    local = block_reduce(od, near)[rows // near, cols // near]  # (n, 3): the block of STREAK_GAP_UM around
    excess = []
    for c in range(3):
        surround = ndimage.uniform_filter(coarse[..., c] * stained, size, mode="nearest") / share
        excess.append(local[:, c] - surround[rows // block, cols // block])
    green = excess[1]
    hit = green >= _GREY_MIN_EXCESS
    hit &= excess[0] >= _GREY_EXCESS_RED * green
    hit &= excess[2] >= _GREY_EXCESS_BLUE * green
    out[rows[hit], cols[hit]] = True
    return out


__all__ = ["grey_bands", "grey_excess"]

"""Where a straight marker stroke goes on: the band that continues it beyond each of its ends.

A marker dragged from glass onto tissue fades as it dries: its end over tissue is faint streaks, mixed
with the tissue's own colour, and often broken off from the stroke by a stretch where the pen skipped.
Colour alone cannot tell such streaks from eosin beside the stroke; their place can: they lie on the
stroke's own line, within its width, past its end. Tissue beside a stroke lies off that line. The line is
the stroke's principal axis (the eigenvector of its pixels' covariance), measured only on strokes
straight enough to have one (a ring or a loop has no ends and no single direction).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from wsi.tiling.artifacts.colour import EosinRatios, red_od_ratio

#: a stroke has a line to continue when it is at least this many times as long as it is wide (along its
#: principal axis, against twice the 95th percentile of its pixels' distance from that axis; HistoQC's
#: red arcs along a section's edge: 4 and 3 took 3 more of the tuning images' red tiles than 5)
_MIN_STRAIGHTNESS = 4.0
#: ... and at least this long (um): shorter red regions are specks or the streaks themselves (1,000 took
#: an ink-free tissue tile of the tuning images and no inked one)
_MIN_LENGTH_UM = 1500.0
#: the band continues the stroke this far (um) past each end, at most the stroke's own length (HistoQC's
#: red pen: a stroke's faint end over tissue 0.3-3 mm on past where its dense part stops)
_REACH_UM = 3000.0
#: ... and is as wide as the stroke, plus this on each side (um): a hand-drawn line bends, and a pen
#: set down again leaves its smear beside the line (HistoQC's red pen: 100 took 3 fewer tiles than 400,
#: measured before the straightness and ratio bounds were chosen)
_SIDE_UM = 400.0
#: on that band, a pixel of red marker's colour is the stroke's end where its OD_R / OD_G lies under
#: this share of the way from the slide's least eosin ratio (10th percentile) to its median eosin: marker
#: over tissue absorbs less red light than the tissue alone (HistoQC's red pen over tissue: 0.16-0.35 on
#: a slide whose eosin is 0.28-0.52; of the tuning images' 22 red tiles kept, 0 (under its least
#: eosin) took 5, 0.3 took 13, 0.5 took 14 (strokes 5 times as long as wide); no ink-free tissue tile of
#: the tuning images at any of them)
_END_TOWARD_EOSIN = 0.3
#: ... measured from this green OD (paler pixels' ratio is noise)
_END_MIN_OD = 0.15


def continued_red(
    strokes: np.ndarray, candidates: np.ndarray, od: np.ndarray, mpp: float, eosin: EosinRatios | None
) -> np.ndarray:
    """The red `strokes` (bool, at `mpp` um/px) with the pixels of `candidates` (red marker's colour) on
    their line past their ends (`stroke_ends`) that absorb less red light than most of the slide's eosin
    (`_END_TOWARD_EOSIN`; `od`: (h, w, 3) optical density; `eosin`: the slide's, None if unmeasured:
    the candidates' own bound then decides)."""
    ends = stroke_ends(strokes, mpp)
    if not ends.any():
        return strokes
    on_line = candidates & ends & (od[..., 1] >= _END_MIN_OD)
    if eosin is not None:
        on_line &= red_od_ratio(od) < eosin.low + _END_TOWARD_EOSIN * (eosin.median - eosin.low)
    return strokes | on_line


def stroke_ends(strokes: np.ndarray, mpp: float) -> np.ndarray:
    """(h, w) bool: the bands continuing each straight region of `strokes` (a bool mask at `mpp` um/px)
    past both of its ends, as wide as the region (`_MIN_STRAIGHTNESS`, `_REACH_UM`, `_SIDE_UM`); the
    regions themselves are not in it."""
    out = np.zeros(strokes.shape, bool)
    if not strokes.any():
        return out
    labels, n = ndimage.label(strokes, structure=np.ones((3, 3), bool))
    if not n:
        return out
    least = int((_MIN_LENGTH_UM / mpp) ** 2 / (_MIN_STRAIGHTNESS * _MIN_STRAIGHTNESS))
    areas = np.bincount(labels.ravel(), minlength=n + 1)
    h, w = strokes.shape
    for i, box in enumerate(ndimage.find_objects(labels), 1):
        if box is None or areas[i] < least:
            continue
        rows, cols = np.nonzero(labels[box] == i)
        pts = np.stack([rows + box[0].start, cols + box[1].start], axis=1).astype(np.float64)
        centre = pts.mean(axis=0)
        _, vectors = np.linalg.eigh(np.cov((pts - centre).T))
        axis, side = vectors[:, 1], vectors[:, 0]  # eigh: ascending eigenvalues
        along, across = (pts - centre) @ axis, (pts - centre) @ side
        length = float(along.max() - along.min()) + 1.0
        half = float(np.percentile(np.abs(across), 95)) + 0.5
        if length * mpp < _MIN_LENGTH_UM or length < _MIN_STRAIGHTNESS * 2.0 * half:
            continue
        reach = min(_REACH_UM / mpp, length)
        half += _SIDE_UM / mpp
        for start, sign in ((float(along.max()), 1.0), (float(along.min()), -1.0)):
            out |= _band(centre, axis, side, start, sign * reach, half, (h, w))
    return out & ~strokes


def _band(
    centre: np.ndarray,
    axis: np.ndarray,
    side: np.ndarray,
    start: float,
    reach: float,
    half: float,
    shape: tuple[int, int],
) -> np.ndarray:
    """(h, w) bool: the pixels whose place along `axis` (from `centre`) lies between `start` and `start +
    reach` and across it within `half` (all in px), computed on the band's bounding box only."""
    out = np.zeros(shape, bool)
    ends = [centre + axis * a + side * s for a in (start, start + reach) for s in (-half, half)]
    lo = np.floor(np.min(ends, axis=0)).astype(int)
    hi = np.ceil(np.max(ends, axis=0)).astype(int) + 1
    r0, c0 = max(lo[0], 0), max(lo[1], 0)
    r1, c1 = min(hi[0], shape[0]), min(hi[1], shape[1])
    if r0 >= r1 or c0 >= c1:
        return out
    rr, cc = np.mgrid[r0:r1, c0:c1]
    dr, dc = rr - centre[0], cc - centre[1]
    along = dr * axis[0] + dc * axis[1]
    across = dr * side[0] + dc * side[1]
    a, b = sorted((start, start + reach))
    out[r0:r1, c0:c1] = (along >= a) & (along <= b) & (np.abs(across) <= half)
    return out


__all__ = ["continued_red", "stroke_ends"]

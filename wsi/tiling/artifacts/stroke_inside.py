"""The purple inside of a purple-black marker stroke: as dark as a fold, joined to the stroke's black.

Markers sold as black are often purple-black (`colour`): a felt tip lays its ink densest along the
stroke's edges and where it stops, and thinner along its middle, so a wide stroke's black (value <= 0.25,
`ArtifactParams.black_max_value`) is often only its two edges and its dots, and its inside is a
saturated dark purple (MSKCC's tuning loops: value 0.2-0.35, saturation 0.4-0.7, hue 290-305). That is
the colour of a fold (`folds`: value <= 0.35, saturation >= 0.2), never of single-layer tissue: dense
nuclei stay above ~0.3 at thumbnail scale and are thin specks, not regions joined to a stroke. So dark
purple joined to a black stroke, within _REACH_UM of its black (half the widest marker tip), is that
stroke's inside. A fold the stroke crosses is taken with it (rejected either way); a grey fine line (a
coverslip's edge, neutral: saturation under 0.2) is left to the faint-black growth and bubble filter.
"""

from __future__ import annotations

import numpy as np

from wsi.tiling.morphology import dilate_disk_on_blocks, label

#: as dark as a fold at most (`ArtifactParams.fold_max_value`): brighter purple is tissue's (0.3 took
#: 51 fewer of the tuning images' black inked tiles and no more ink-free tissue; 0.4 took 35 more and
#: one more ink-free tissue tile)
_MAX_VALUE = 0.35
#: ... and purple, not grey: grey and brownish faint black follows a stroke already (`ink`), a grey fine
#: line joined to a stroke is a coverslip's edge as often
_MIN_SATURATION = 0.2
#: at most this far (um) from the stroke's black: a stroke's inside lies between its black edges (marker
#: tips 0.3-2 mm wide; 250 took 13 fewer tuning tiles, 1,000 3 more)
_REACH_UM = 500.0


def stroke_inside(
    strokes: np.ndarray, val: np.ndarray, sat: np.ndarray, mpp: float, *, exclude: np.ndarray | None = None
) -> np.ndarray:
    """(h, w) bool: the dark purple pixels (value <= _MAX_VALUE, saturation > _MIN_SATURATION, not
    `exclude`) within about _REACH_UM of the black `strokes` that are joined to them
    (8-connected): a purple-black stroke's inside. `val`, `sat`: HSV value and saturation (0-1) at
    `mpp` um/px."""
    if not strokes.any():
        return np.zeros(strokes.shape, bool)
    inside = (val <= _MAX_VALUE) & (val > 0.05) & (sat > _MIN_SATURATION)
    if exclude is not None:
        inside &= ~exclude
    # a pixel's precision is not needed (and a disk of the full reach cost 30-60 ms per thumbnail)
    reach = _REACH_UM / mpp
    inside &= dilate_disk_on_blocks(strokes, reach, max(1, int(reach / 8)))
    labels = label(inside | strokes, connectivity=2)
    joined = np.zeros(int(labels.max()) + 1, bool)
    joined[labels[strokes]] = True
    joined[0] = False
    return joined[labels] & inside


__all__ = ["stroke_inside"]

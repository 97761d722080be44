"""Blood on the thumbnail, for users who want it out (the `blood` filter, off by default).

Haemorrhage, clots and congested vessels are tissue, and the ink filter keeps them: red marker is told
from them by how it absorbs (`colour.red_od_ratio`), its size and its stroke's shape (`ink`). A user
training on, say, tumour morphology may still want tiles that are mostly blood out; that is this
filter's reason, `blood`, so that it is never counted as ink. Blood is the saturated red that absorbs
like H&E: hue 342-15 degrees (the red marker's range, `red_hue_min` / `red_hue_max`), saturation at
least BLOOD_MIN_SATURATION, bright enough to be red (BLOOD_MIN_VALUE: a dark pixel of that hue is
brown-black marker or pigment), stained (green OD >= `colour.RED_DENSE_OD`), and not marker (the ink
filter's regions are left out).
"""

from __future__ import annotations

import numpy as np

from wsi.tiling.artifacts.colour import HSV, RED_DENSE_OD
from wsi.tiling.morphology import open_disk
from wsi.tiling.params import ArtifactParams

#: blood in a thumbnail: as saturated as this (eosin-rich stroma mostly stays under it; red muscle does
#: not, and is taken with blood)
BLOOD_MIN_SATURATION = 0.45
#: ... and its brightest channel at least this (0-1)
BLOOD_MIN_VALUE = 0.4
#: specks thinner than this (um) are single vessels' worth of red cells, left alone
_MIN_WIDTH_UM = 30.0


def blood_regions(
    planes: HSV, od: np.ndarray, *, mpp: float, params: ArtifactParams, exclude: np.ndarray | None = None
) -> np.ndarray:
    """(h, w) bool: blood on a thumbnail (its HSV `planes`, (h, w, 3) optical density `od`) at `mpp` um/px;
    `exclude`: the ink filter's regions (red marker is not blood)."""
    hue, sat, val = planes
    red = (hue >= params.red_hue_min) | (hue <= params.red_hue_max)
    blood = red & (sat >= BLOOD_MIN_SATURATION) & (val >= BLOOD_MIN_VALUE) & (od[..., 1] >= RED_DENSE_OD)
    if exclude is not None:
        blood &= ~exclude
    return open_disk(blood, _MIN_WIDTH_UM / 2 / mpp)

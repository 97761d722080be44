"""Dust islands on the thumbnail: tissue-mask regions too small to be a section and far from any real
tissue (dust, debris, a fleck of stain on the glass), which the tissue mask's own size floor let
through. A slide of only small fragments (needle biopsies, cytology) has no larger region to be far
from, so none of them is called dust.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage
from skimage.measure import label

from wsi.artifacts.params import ArtifactParams


def dust_regions(tissue: np.ndarray, *, mpp: float, params: ArtifactParams) -> np.ndarray:
    """(h, w) bool: the small, isolated regions of the (h, w) tissue mask at `mpp` um/px."""
    labels = label(tissue, connectivity=2)
    n = int(labels.max())
    if n < 2:
        return np.zeros(tissue.shape, bool)
    areas = np.bincount(labels.ravel(), minlength=n + 1) * (mpp * mpp)
    small = areas <= params.dust_max_um2
    small[0] = False
    big = ~small
    big[0] = False
    if not big[1:].any() or not small.any():
        return np.zeros(tissue.shape, bool)
    # distance (um) from every pixel to the nearest pixel of a larger region
    distance = ndimage.distance_transform_edt(~big[labels]) * mpp
    nearest = ndimage.minimum(distance, labels, index=np.arange(n + 1))
    dust = small & (np.asarray(nearest) > params.dust_gap_um)
    return dust[labels]

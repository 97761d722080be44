"""Dust islands on the thumbnail: tissue-mask regions too small to be a section and far from any real
tissue (dust, debris, a fleck of stain on the glass), which the tissue mask's own size floor let
through. A slide of only small fragments (needle biopsies, cytology) has no larger region to be far
from, so none of them is called dust.
"""

from __future__ import annotations

import numpy as np

from wsi.tiling.morphology import dilate_disk_on_blocks, label
from wsi.tiling.params import ArtifactParams


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
    # "near a larger region" on a grid ~10x coarser than the gap: the distance is then off by at most
    # a tenth of the gap, and the transform costs 1/100 of one at full size
    c = max(1, int(params.dust_gap_um / (10 * mpp)))
    near = dilate_disk_on_blocks(big[labels], params.dust_gap_um / mpp, c)
    is_near = np.zeros(n + 1, bool)
    is_near[labels[near & small[labels]]] = True
    dust = small & ~is_near
    return dust[labels]

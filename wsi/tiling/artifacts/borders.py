"""Out-of-scan borders on the thumbnail: flat, near-black fill that reaches the image's edge.

Scanners pad what they did not scan (the region outside the scanned area, missing tiles of a sparse
pyramid) with one flat colour, often black; tissue and even black ink have texture and some colour
(marker ink is brownish or bluish black), and neither fills the frame from its edge.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from wsi.tiling.morphology import label
from wsi.tiling.params import ArtifactParams

#: the fill's brightness varies by at most this (0-255 standard deviation) over a region
_MAX_FILL_STD = 3.0


def border_regions(thumb: np.ndarray, *, params: ArtifactParams) -> np.ndarray:
    """(h, w) bool: flat near-black regions of an (h, w, 3) thumbnail (0-255, any dtype) that touch
    its edge."""
    px = thumb[..., :3].astype(np.float32)
    high = np.maximum(np.maximum(px[..., 0], px[..., 1]), px[..., 2])
    low = np.minimum(np.minimum(px[..., 0], px[..., 1]), px[..., 2])
    flat = (high <= params.border_level) & (high - low <= params.border_flatness)
    if not flat.any():
        return flat
    labels = label(flat, connectivity=1)
    edge = np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])
    touching = np.unique(edge[edge > 0])
    if touching.size == 0:
        return np.zeros(flat.shape, bool)
    # fill is one colour (give or take JPEG noise); black marker ink that reaches the edge has texture
    index = np.arange(int(labels.max()) + 1)
    spread = np.asarray(ndimage.standard_deviation(high, labels, index=index))
    keep = touching[spread[touching] <= _MAX_FILL_STD]
    return np.isin(labels, keep)

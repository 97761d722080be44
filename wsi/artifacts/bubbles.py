"""Air bubbles and coverslip edges on the thumbnail: long, thin, grey lines darker than what is beside
them (a bubble's rim, the coverslip's edge and the mountant's ridge along it).

After HistoQC's `BubbleRegionByRegion.pixelWise` (choosehappy/HistoQC @b7956129), which marks dark
ridges found with a Frangi vesselness filter (grey < 0.3, response > 5, small objects removed). Ours is
cheaper and keeps pale lines (an IHC slide's coverslip edge is light grey on glass): a black top-hat
(the image closed with a disk wider than the line, minus the image) finds thin dark structures of
any brightness; grey (unsaturated) and long ones are kept, stained tissue and short debris are not.
The line is widened by its own width, so that a tile counts the band the rim spoils.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage
from skimage.measure import label
from skimage.morphology import black_tophat, dilation, disk

from wsi.artifacts.colour import hsv
from wsi.artifacts.params import ArtifactParams


def bubble_regions(thumb: np.ndarray, *, mpp: float, params: ArtifactParams) -> np.ndarray:
    """(h, w) bool: bubble rims and coverslip edges on an (h, w, 3) uint8 thumbnail at `mpp` um/px."""
    r = max(1, round(params.bubble_line_um / 2 / mpp))
    _, sat, val = hsv(thumb)
    dark_line = black_tophat(val, disk(r)) >= params.bubble_contrast
    mask = dark_line & (sat <= params.bubble_max_saturation)
    labels = label(mask, connectivity=2)
    if labels.max() == 0:
        return mask
    min_len = params.bubble_min_length_um / mpp
    long = np.zeros(labels.max() + 1, bool)
    for i, box in enumerate(ndimage.find_objects(labels), start=1):
        if box is not None and np.hypot(box[0].stop - box[0].start, box[1].stop - box[1].start) >= min_len:
            long[i] = True
    return dilation(long[labels], disk(r))

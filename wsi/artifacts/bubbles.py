"""Air bubbles and coverslip edges on the thumbnail: long, thin, grey lines darker than what is beside
them (a bubble's rim, the coverslip's edge and the mountant's ridge along it).

After HistoQC's `BubbleRegionByRegion.pixelWise` (choosehappy/HistoQC @b7956129), which marks dark
ridges found with a Frangi vesselness filter (grey < 0.3, response > 5, small objects removed). Ours is
cheaper and keeps pale lines (an IHC slide's coverslip edge is light grey on glass): a black top-hat
(the image closed with a disk wider than the line, minus the image) finds thin dark structures of
any brightness; grey (unsaturated) and long ones are kept, stained tissue and short debris are not.
The brightness used is each block's darkest pixel (`dark`), so a line thinner than a block survives
the downsampling at full contrast. The line is widened by its own width: a tile counts the band the
rim spoils.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from wsi.artifacts.morph import dilate
from wsi.morphology import black_tophat, disk, label
from wsi.tile_params import ArtifactParams


def bubble_regions(
    dark: np.ndarray, sat: np.ndarray, tissue: np.ndarray, *, mpp: float, params: ArtifactParams
) -> np.ndarray:
    """(h, w) bool: bubble rims and coverslip edges from a thumbnail's (h, w) darkest-pixel brightness
    `dark` (0-1), saturation `sat` and tissue mask, at `mpp` um/px. Lines are looked for off the
    tissue: pale IHC tissue is nearly as grey as a rim, and its texture is full of short dark lines;
    a tile with a long rim or edge running beside the tissue still gets its share of the band."""
    r = max(1, round(params.bubble_line_um / 2 / mpp))
    line = black_tophat(dark, disk(r)) >= params.bubble_contrast
    mask = line & (sat <= params.bubble_max_saturation) & ~tissue
    labels = label(mask, connectivity=2)
    if labels.max() == 0:
        return mask
    min_len = params.bubble_min_length_um / mpp
    areas = np.bincount(labels.ravel())
    long = np.zeros(labels.max() + 1, bool)
    for i, box in enumerate(ndimage.find_objects(labels), start=1):
        if box is None:
            continue
        length = np.hypot(box[0].stop - box[0].start, box[1].stop - box[1].start)
        # a line (or a ring) is long, and thin: its area is about its length times its width, where
        # a patch of textured tissue or debris as long is far wider
        long[i] = length >= min_len and areas[i] <= 3 * r * length
    return dilate(long[labels], r)

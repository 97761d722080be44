"""Air bubbles and coverslip edges on the thumbnail: long, thin, grey lines darker than what is beside
them (a bubble's rim, the coverslip's edge and the mountant's ridge along it).

After HistoQC's `BubbleRegionByRegion.pixelWise` (choosehappy/HistoQC @b7956129), which marks dark
ridges found with a Frangi vesselness filter (grey < 0.3, response > 5, small objects removed). Ours is
cheaper and keeps pale lines (an IHC slide's coverslip edge is light grey on glass): a black top-hat
(the image closed with a disk wider than the line, minus the image) finds thin dark structures of
any brightness; grey (unsaturated) and long ones are kept, stained tissue and short debris are not.
The colour used is each block's darkest value per channel (`dark`, `sat`), so a line thinner than a
block survives the downsampling at full contrast and in its own colour. The line is widened by its own
width: a tile counts the band the rim spoils.

Lacy tissue is no rim: the alveolar walls of lung, thin and pale between air spaces the tissue mask
leaves out, are long grey lines too (they took 20-220 tissue tiles per MSKCC lung slide as "bubble").
A rim or an edge is a smooth line (few branch points per mm of its skeleton) or runs over the glass
(most of it hundreds of um from any tissue); a net of walls beside its own tissue is neither.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from wsi.tiling.morphology import black_tophat, closing, dilate_disk, disk, label
from wsi.tiling.params import ArtifactParams

#: a line with more branch points per mm of its skeleton than this is a net (lacy tissue), not a rim
_MAX_BRANCHES_PER_MM = 10.0
#: ... unless most of it lies this far (um) from any tissue: a coverslip edge's mountant ridge is
#: ragged too, but it runs over the glass, where a lacy tissue's walls border its own tissue
_LACE_GAP_UM = 300.0


def bubble_regions(
    dark: np.ndarray, sat: np.ndarray, tissue: np.ndarray, *, mpp: float, params: ArtifactParams
) -> np.ndarray:
    """(h, w) bool: bubble rims and coverslip edges from a thumbnail's (h, w) darkest-pixel brightness
    `dark` (float 0-1, or uint8 0-255: the same lines, the closing done in bytes at a third of the cost),
    saturation `sat` and tissue mask, at `mpp` um/px. Lines are looked for off the
    tissue: pale IHC tissue is nearly as grey as a rim, and its texture is full of short dark lines;
    a tile with a long rim or edge running beside the tissue still gets its share of the band."""
    r = max(1, round(params.bubble_line_um / 2 / mpp))
    line = _tophat(dark, disk(r)) >= params.bubble_contrast
    mask = line & (sat <= params.bubble_max_saturation) & ~tissue
    labels = label(mask, connectivity=2)
    if labels.max() == 0:
        return mask
    min_len = params.bubble_min_length_um / mpp
    areas = np.bincount(labels.ravel())
    away: np.ndarray | None = None  # um from the nearest tissue, when a line is not smooth
    long = np.zeros(labels.max() + 1, bool)
    for i, box in enumerate(ndimage.find_objects(labels), start=1):
        if box is None:
            continue
        length = np.hypot(box[0].stop - box[0].start, box[1].stop - box[1].start)
        # a line (or a ring) is long, and thin: its area is about its length times its width, where
        # a patch of textured tissue or debris as long is far wider
        if not (length >= min_len and areas[i] <= 3 * r * length):
            continue
        part = labels[box] == i
        if _smooth(part, mpp):
            long[i] = True
            continue
        if away is None:
            away = np.asarray(ndimage.distance_transform_edt(~tissue)) * mpp
        long[i] = float(np.median(away[box][part])) >= _LACE_GAP_UM
    return dilate_disk(long[labels], r)


def _tophat(dark: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """Float32 black top-hat of `dark` on the 0-1 scale. uint8: closed in bytes, then both scaled by
    1/255 as the float caller does (max and min commute with that increasing map: the same values)."""
    if dark.dtype != np.uint8:
        return black_tophat(dark, footprint)
    closed = closing(dark, footprint).astype(np.float32) / 255.0
    closed -= dark.astype(np.float32) / 255.0
    return closed


def _smooth(part: np.ndarray, mpp: float) -> bool:
    """A rim or an edge is a smooth line: few branch points per mm of its skeleton. The thin walls of
    lung alveoli (or any lacy tissue) at the tissue's edge form a net: about 20 branch points per mm."""
    from skimage.morphology import skeletonize  # only for a long thin line, the rare case

    skeleton = skeletonize(part)
    neighbours = ndimage.convolve(skeleton.astype(np.int16), np.ones((3, 3), np.int16), mode="constant")
    branches = np.count_nonzero(skeleton & (neighbours >= 4))  # the pixel and 3+ neighbours
    return bool(branches <= _MAX_BRANCHES_PER_MM * np.count_nonzero(skeleton) * mpp / 1000.0)

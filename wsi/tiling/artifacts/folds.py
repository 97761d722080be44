"""Tissue folds on the thumbnail: where tissue lies in two layers it absorbs about twice the light
(optical density adds up), so a fold is tissue far darker than the slide's own typical tissue, lying
beside single-layer tissue of its own piece.

Relative to the slide, not a fixed level: HistoQC's `LightDarkModule.getIntensityThresholdPercent:
darktissue` (choosehappy/HistoQC @b7956129, config_v2.1.ini upper_thresh .15 on grey) uses a fixed
level, which calls a lymph node's dense haematoxylin dark. Ours asks for both: darker than
`fold_max_value` AND at least `fold_od_ratio` times the optical density of the slide's median tissue,
and stained (grey-black lines are bubble rims, coverslip edges or ink, judged by their own filters).

Relative to its own fragment too (`_with_own_tissue`): the slide's median is that of its largest
pieces. A slide of small biopsy pieces (needle cores, endoscopic biopsies, curettings) mixes pale and
dense ones, and a dense piece (lymphoid, crushed, or cut thicker) is as dark against the slide's median
as a fold, all over. A fold is two layers of the SAME tissue, far darker than that fragment's own
single layer beside it. So a dark region is a fold only where its own fragment has
single-layer tissue near it (`_SURROUND_UM`, at least `_MIN_SURROUND_SHARE` of the region's area); a
fragment dark all over (no paler tissue of its own) is dense tissue. And it must be far denser than
that tissue (`_MIN_LAYERS`): two layers absorb twice; a real fold of the tuning images is 1.6-2.3 times
as dense as the tissue within 1 mm of it (its thinner fringe and a section's dense edge lie there). A
dark piece only a quarter denser than its own paler part is one layer stained darker.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from wsi.tiling.artifacts.colour import HSV
from wsi.tiling.morphology import dilation, disk, erosion, label, open_disk, remove_small_objects
from wsi.tiling.params import ArtifactParams

#: folds narrower than this (um) are dense nuclei, not a fold
_MIN_WIDTH_UM = 24.0
#: fold regions smaller than this (um^2) are left alone
_MIN_REGION_UM2 = 40_000.0
#: a fold's own single-layer tissue is looked for within this distance (um) of it, in its own fragment
_SURROUND_UM = 1000.0
#: ... leaving out the fragment's rim (a thumbnail pixel at the edge mixes tissue and glass: paler) and
#: the fold's own edge (as dark as the fold, but cut off by the opening): this far (um) from either
_EDGE_UM = 50.0
#: ... and there must be at least this much of it (a share of the fold's own area): a fragment with
#: less single-layer tissue than that is dark all over, i.e. dense, and its dark part no fold
_MIN_SURROUND_SHARE = 0.5
#: ... and the region's median optical density at least this many times that tissue's (two layers: 2)
_MIN_LAYERS = 1.5


def fold_regions(
    planes: HSV,
    tissue: np.ndarray,
    *,
    mpp: float,
    params: ArtifactParams,
    exclude: np.ndarray | None = None,
) -> np.ndarray:
    """(h, w) bool: folds in the (h, w) `tissue` of a thumbnail (its HSV `planes`) at `mpp` um/px;
    `exclude`: pixels already called another artifact (ink), left out of the slide's median."""
    usable = tissue & ~exclude if exclude is not None else tissue
    if np.count_nonzero(usable) < 16:
        return np.zeros(tissue.shape, bool)
    _, sat, val = planes
    typical = float(np.median(val[usable]))
    level = min(params.fold_max_value, typical**params.fold_od_ratio)  # OD = -log(value) scales by ratio
    mask = open_disk(usable & (val <= level) & (sat >= params.fold_min_saturation), _MIN_WIDTH_UM / 2 / mpp)
    mask = remove_small_objects(mask, max_size=int(_MIN_REGION_UM2 / (mpp * mpp)))
    if not mask.any():
        return mask
    # beside ink, a dark band is the marker's faint edge (the ink filter's to miss, this one's to keep): the
    # question of the tissue's own density is not asked there
    edge = disk(max(1, round(_EDGE_UM / mpp)))  # whole pixels: the row-wise filter (a tenth of scipy's cost)
    beside_ink = dilation(exclude, edge) if exclude is not None and exclude.any() else None
    od = -np.log(np.maximum(val, np.float32(1.0 / 255.0)))
    return _with_own_tissue(mask, tissue, usable, od, mpp=mpp, edge=edge, beside=beside_ink)


def _with_own_tissue(
    candidates: np.ndarray,
    tissue: np.ndarray,
    usable: np.ndarray,
    od: np.ndarray,
    *,
    mpp: float,
    edge: np.ndarray,
    beside: np.ndarray | None,
) -> np.ndarray:
    """The `candidates` regions (8-connected) with single-layer tissue of their own fragment (the connected
    part of `tissue` they lie in) around them: `usable` pixels within _SURROUND_UM of the region, not
    candidates, the footprint `edge` (_EDGE_UM) away from the fragment's rim and from the region, at
    least _MIN_SURROUND_SHARE of the region's area, whose median `od` (optical density per pixel) the
    region's exceeds _MIN_LAYERS times. Regions touching `beside` are kept as they are. A
    pixel counts for the region nearest to it (one distance transform, over the box of the regions asked
    about, grown by _SURROUND_UM)."""
    regions = label(candidates, connectivity=2)
    n = int(regions.max()) + 1
    kept = np.zeros(n, bool)
    if beside is not None:
        kept[regions[beside]] = True
        kept[0] = False
    asked = candidates & ~kept[regions]
    if not asked.any():
        return candidates
    reach = int(np.ceil(_SURROUND_UM / mpp)) + 1
    rows, cols = np.nonzero(asked)
    box = (
        slice(max(0, int(rows.min()) - reach), int(rows.max()) + reach + 1),
        slice(max(0, int(cols.min()) - reach), int(cols.max()) + reach + 1),
    )
    inside = np.where(asked[box], regions[box], 0)
    fragments = label(tissue[box], connectivity=2)
    single = usable[box] & erosion(tissue[box], edge) & ~dilation(candidates[box], edge)
    distance, (near_row, near_col) = ndimage.distance_transform_edt(inside == 0, return_indices=True)
    # its own fragment: the one the nearest fold pixel lies in
    around = single & (distance <= _SURROUND_UM / mpp) & (fragments[near_row, near_col] == fragments)
    owner = np.where(around, inside[near_row, near_col], 0)
    counts = np.bincount(owner.ravel(), minlength=n)
    # less than that: the fragment is dark all over, a dense piece, not two layers of a paler one
    enough = counts >= _MIN_SURROUND_SHARE * np.bincount(regions[asked], minlength=n)
    ids = np.flatnonzero(enough[1:]) + 1
    if len(ids):
        own = np.asarray(ndimage.median(od[box], labels=inside, index=ids))
        beside_od = np.asarray(ndimage.median(od[box], labels=owner, index=ids))
        kept[ids] |= own >= _MIN_LAYERS * beside_od  # a quarter denser: one layer stained darker
    kept[0] = False
    return kept[regions]

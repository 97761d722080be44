"""Tissue folds on the thumbnail: where tissue lies in two layers it absorbs about twice the light
(optical density adds up), so a fold is tissue far darker than the slide's own typical tissue.

Relative to the slide, not a fixed level: HistoQC's `LightDarkModule.getIntensityThresholdPercent:
darktissue` (choosehappy/HistoQC @b7956129, config_v2.1.ini upper_thresh .15 on grey) uses a fixed
level, which calls a lymph node's dense haematoxylin dark. Ours asks for both: darker than
`fold_max_value` AND at least `fold_od_ratio` times the optical density of the slide's median tissue,
and stained (grey-black lines are bubble rims, coverslip edges or ink, judged by their own filters).
"""

from __future__ import annotations

import numpy as np

from wsi.tiling.artifacts.colour import HSV
from wsi.tiling.morphology import open_disk, remove_small_objects
from wsi.tiling.params import ArtifactParams

#: folds narrower than this (um) are dense nuclei, not a fold
_MIN_WIDTH_UM = 24.0
#: fold regions smaller than this (um^2) are left alone
_MIN_REGION_UM2 = 40_000.0


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
    return remove_small_objects(mask, max_size=int(_MIN_REGION_UM2 / (mpp * mpp)))

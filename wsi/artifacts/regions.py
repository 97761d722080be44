"""All artifact filters on one thumbnail, and each grid cell's share of every artifact:

find_artifacts(thumb, tissue, mpp=..., params=...) -> ArtifactMaps   # region masks, thumbnail px
ArtifactMaps.shares(boxes) -> {name: (N,) share of each box}          # boxes in thumbnail px
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from wsi.artifacts.borders import border_regions
from wsi.artifacts.bubbles import bubble_regions
from wsi.artifacts.dust import dust_regions
from wsi.artifacts.folds import fold_regions
from wsi.artifacts.ink import ink_regions
from wsi.artifacts.params import FILTERS, ArtifactParams
from wsi.tissue import cell_fractions


@dataclass(frozen=True)
class ArtifactMaps:
    """(h, w) bool mask of each filter that ran, on the thumbnail; a filter turned off has none."""

    masks: Mapping[str, np.ndarray] = field(default_factory=dict)

    def shares(self, boxes: np.ndarray) -> dict[str, np.ndarray]:
        """Filter -> (N,) share of each (x0, y0, x1, y1) box (thumbnail px) that is that artifact."""
        return {name: cell_fractions(mask, boxes) for name, mask in self.masks.items()}


def find_artifacts(
    thumb: np.ndarray, tissue: np.ndarray, *, mpp: float, params: ArtifactParams
) -> ArtifactMaps:
    """Every filter in params.filters on an (h, w, 3) uint8 brightfield thumbnail at `mpp` um/px with
    its (h, w) tissue mask. Ink is found first and left out of the fold filter's idea of typical tissue."""
    masks: dict[str, np.ndarray] = {}
    ink = ink_regions(thumb, mpp=mpp, params=params) if params.on("ink") or params.on("fold") else None
    if params.on("ink") and ink is not None:
        masks["ink"] = ink
    if params.on("fold"):
        masks["fold"] = fold_regions(thumb, tissue, mpp=mpp, params=params, exclude=ink)
    if params.on("bubble"):
        masks["bubble"] = bubble_regions(thumb, mpp=mpp, params=params)
    if params.on("border"):
        masks["border"] = border_regions(thumb, params=params)
    if params.on("dust"):
        masks["dust"] = dust_regions(tissue, mpp=mpp, params=params)
    return ArtifactMaps({name: masks[name] for name in FILTERS if name in masks})

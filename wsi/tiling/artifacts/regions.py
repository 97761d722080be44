"""All artifact filters on one thumbnail, and each grid cell's share of every artifact:

    find_artifacts(thumb, tissue, mpp=..., params=...) -> ArtifactMaps   # region masks
    ArtifactMaps.shares(boxes) -> {name: (N,) share of each box}          # boxes in thumbnail px

The filters run on the thumbnail reduced to about REGION_MPP um/px (blocks averaged; for the thin
lines of bubbles and coverslip edges, each block's darkest pixel): a 256 um tile is still 16 pixels
there, and the regions cost a quarter of the work at 8 um/px (tiling throughput, docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from wsi.tiling.artifacts.blood import blood_regions
from wsi.tiling.artifacts.borders import border_regions
from wsi.tiling.artifacts.bubbles import bubble_regions
from wsi.tiling.artifacts.colour import hsv, optical_density
from wsi.tiling.artifacts.dust import dust_regions
from wsi.tiling.artifacts.folds import fold_regions
from wsi.tiling.artifacts.ink import ink_colour_regions
from wsi.tiling.morphology import block_reduce
from wsi.tiling.params import ARTIFACT_FILTERS as FILTERS
from wsi.tiling.params import ArtifactParams
from wsi.tiling.tissue import cell_fractions

#: resolution (um/px) the region filters work at; the thumbnail is reduced to it by whole blocks
REGION_MPP = 16.0


@dataclass(frozen=True)
class ArtifactMaps:
    """(h, w) bool mask of each filter that ran (a filter turned off has none), at `scale` mask
    pixels per thumbnail pixel (1 / the block size)."""

    masks: Mapping[str, np.ndarray] = field(default_factory=dict)
    scale: float = 1.0
    #: (h, w) uint8 the colour of the ink at each mask pixel (`colour.colour_code`; 0: none), or None
    ink_colours: np.ndarray | None = None

    def shares(self, boxes: np.ndarray) -> dict[str, np.ndarray]:
        """Filter -> (N,) share of each (x0, y0, x1, y1) box (thumbnail px) that is that artifact."""
        scaled = np.asarray(boxes, np.float64) * self.scale
        # a filter that found nothing (most of them, on most slides) needs no summed-area table
        return {
            name: cell_fractions(mask, scaled) if mask.any() else np.zeros(len(scaled))
            for name, mask in self.masks.items()
        }

    def colours(self, boxes: np.ndarray) -> np.ndarray:
        """(N,) uint8 the ink colour covering most of each (x0, y0, x1, y1) box (thumbnail px; 0: none)."""
        out = np.zeros(len(boxes), np.uint8)
        if self.ink_colours is None or not self.ink_colours.any():
            return out
        scaled = np.asarray(boxes, np.float64) * self.scale
        present = [int(c) for c in np.unique(self.ink_colours) if c]
        shares = np.stack([cell_fractions(self.ink_colours == c, scaled) for c in present], axis=1)
        best = np.argmax(shares, axis=1)
        out[:] = np.where(shares.max(axis=1) > 0, np.asarray(present, np.uint8)[best], 0)
        return out


def find_artifacts(
    thumb: np.ndarray, tissue: np.ndarray, *, mpp: float, params: ArtifactParams
) -> ArtifactMaps:
    """Every filter in params.filters on an (h, w, 3) uint8 brightfield thumbnail at `mpp` um/px with
    its (h, w) tissue mask. Borders are found first (their fill is not ink), then bubble rims and
    coverslip edges (their grey is not grey marker), then ink, which is left out of the fold filter's
    idea of typical tissue."""
    if not params.filters:
        return ArtifactMaps()
    factor = max(1, round(REGION_MPP / mpp))
    rgb = block_reduce(thumb[..., :3], factor)  # float32 0-255
    at = mpp * factor
    planes = hsv(rgb)
    region_tissue = block_reduce(tissue, factor) >= 0.5  # bool: the share of tissue pixels, float32
    masks: dict[str, np.ndarray] = {}
    border = border_regions(rgb, params=params)  # first: its black fill is not black ink
    if params.on("border"):
        masks["border"] = border
    if params.on("bubble"):
        # each block's darkest value per channel: a line thinner than a block keeps its contrast and its
        # own colour (a grey rim stays grey; a purple alveolar wall stays purple, where the block's mean
        # mixes it with the glass beside it into grey)
        low = block_reduce(thumb[..., :3], factor, how="min")  # uint8
        high_u8 = np.maximum(np.maximum(low[..., 0], low[..., 1]), low[..., 2])
        high = high_u8.astype(np.float32)
        least = np.minimum(np.minimum(low[..., 0], low[..., 1]), low[..., 2]).astype(np.float32)
        line_sat = np.where(high > 0, (high - least) / np.maximum(high, 1.0), 0.0)  # HSV saturation
        # the darkest values, 0-255: bubble_regions closes them in bytes and scales them as high / 255
        masks["bubble"] = bubble_regions(high_u8, line_sat, region_tissue, mpp=at, params=params)
    ink = colours = None
    od = optical_density(rgb) if params.on("ink") or params.on("fold") or params.on("blood") else None
    if od is not None:  # blood is what is red and not marker: it needs the ink regions too
        colours = ink_colour_regions(
            planes, od, mpp=at, params=params, exclude=border, lines=masks.get("bubble")
        )
        ink = colours > 0
    if params.on("ink") and ink is not None:
        masks["ink"] = ink
    if params.on("fold"):
        masks["fold"] = fold_regions(planes, region_tissue, mpp=at, params=params, exclude=ink)
    if params.on("dust"):
        masks["dust"] = dust_regions(region_tissue, mpp=at, params=params)
    if params.on("blood") and od is not None:
        masks["blood"] = blood_regions(planes, od, mpp=at, params=params, exclude=ink)
    return ArtifactMaps(
        {name: masks[name] for name in FILTERS if name in masks},
        scale=1.0 / factor,
        ink_colours=colours if params.on("ink") else None,
    )

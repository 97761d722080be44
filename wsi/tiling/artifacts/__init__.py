"""Artifact filters that need no weights: marker ink, tissue folds, air bubbles and coverslip edges,
out-of-scan borders and dust islands, judged as regions on the slide's thumbnail and per tile (each
tile's share of each artifact, and for ink also the tile's own pixels).

    ArtifactParams                                    # thresholds; `filters` names those that run
    find_artifacts(thumb, tissue, mpp=, params=)      # -> ArtifactMaps (a mask per filter)
    artifact_verdicts(shares, params, tissue=)        # -> (N,) reason code per tile (0: none)
    tile_ink_share(tiles, params)                     # -> (B,) share of ink pixels of read tiles
    judge_tiles(tiles, reasons, region_codes, params, open_=)  # read tiles' reasons with artifacts
    CODES / INK, FOLD, BUBBLE, BORDER, DUST           # reason codes after wsi.tiling.grid's

A dark-background (fluorescence-like) slide is not judged: the colour rules are for brightfield.
"""

from wsi.tiling.artifacts.colour import INK_COLOURS, hsv, ink_mask, ink_pixels, tile_ink_share
from wsi.tiling.artifacts.reasons import (
    BORDER,
    BUBBLE,
    CODES,
    DUST,
    FOLD,
    INK,
    artifact_verdicts,
    judge_tiles,
)
from wsi.tiling.artifacts.regions import ArtifactMaps, find_artifacts
from wsi.tiling.params import ARTIFACT_DESCRIPTIONS as DESCRIPTIONS
from wsi.tiling.params import ARTIFACT_FILTERS as FILTERS
from wsi.tiling.params import ArtifactParams

__all__ = [
    "BORDER", "BUBBLE", "CODES", "DESCRIPTIONS", "DUST", "FILTERS", "FOLD", "INK", "INK_COLOURS",
    "ArtifactMaps", "ArtifactParams", "artifact_verdicts", "find_artifacts", "hsv", "ink_mask",
    "ink_pixels", "judge_tiles", "tile_ink_share",
]  # fmt: skip

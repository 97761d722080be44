"""The artifact filters' settings: `ArtifactParams` lives in `wsi.tile_params` (numpy-free, beside
TileParams, so the command line builds options without the imaging stack); named here for the filters."""

from __future__ import annotations

from wsi.tile_params import ARTIFACT_DESCRIPTIONS as DESCRIPTIONS
from wsi.tile_params import ARTIFACT_FILTERS as FILTERS
from wsi.tile_params import ArtifactParams

__all__ = ["DESCRIPTIONS", "FILTERS", "ArtifactParams"]

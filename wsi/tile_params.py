"""The settings that decide which tiles a slide keeps (TissueParams inside TileParams), stored in every
tile file. Kept apart from the code that applies them (wsi.tissue, wsi.tiling) and free of numpy, so the
command line builds its options from these fields without loading the imaging stack."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wsi.config import config_dict, config_model, setting


@config_model
@dataclass(frozen=True)
class TissueParams:
    """Settings of the tissue mask; defaults suit H&E. Saved inside TileParams (`tissue`) in every tile
    file; built from a mapping only through `wsi.config.parse_config` (unknown keys refused). Ranges
    are the `setting`s' own: they hold for direct construction and for parsing alike."""

    #: 8 um/px gives 32 px per 256 um tile, enough for tissue fractions
    thumb_mpp: float = setting(
        8.0, gt=0, help="Resolution (um/px) of the thumbnail the tissue mask is computed on."
    )
    #: Otsu below it means there is no tissue to split from glass
    min_saturation: float = setting(
        0.05, ge=0, lt=1, help="Lowest HSV saturation counted as tissue (floor of the Otsu threshold)."
    )
    dark_level: int = setting(
        25, ge=0, le=255,
        help="Pixels darker than this (0-255 max channel) are ignored by Otsu (slide labels, black "
        "borders); on a dark-background (fluorescence-like) slide, the least brightness counted as tissue.",
    )  # fmt: skip
    closing_um: float = setting(
        16.0, ge=0, help="Closing radius (um): joins nuclei and stroma of one fragment across pale gaps."
    )
    opening_um: float = setting(8.0, ge=0, help="Opening radius (um): removes dust and thin pen strokes.")
    #: 20,000 um^2 is about a 140 um square
    min_region_um2: float = setting(20_000.0, ge=0, help="Smallest tissue region kept (um^2).")
    max_hole_um2: float = setting(
        250_000.0, ge=0, help="Holes up to this area (um^2) are filled (vessels, lumens, tears)."
    )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (the form stored in tile files)."""
        return config_dict(self)


@config_model
@dataclass(frozen=True)
class TileParams:
    """Every setting that decides which tiles are kept; saved as JSON (`to_dict()`) in each tile file.

    Built from a mapping (a tile file's `params`, a run's recorded `tile_params`, CLI options) only
    through `wsi.config.parse_config(TileParams, data, source=...)`: types converted, unknown keys
    refused. Ranges are the `setting`s' own, checked on direct construction too; `wsi tile` builds its
    options from these fields.
    Adding a field changes the stored JSON, so tile files of older runs are recomputed, never trusted.
    """

    tile_um: float = setting(256.0, gt=0, help="Tile side in micrometres (physical size, whatever the scan).")
    tile_px: int = setting(
        256, ge=8, help="Tile side in pixels after resizing (target um/px = tile-um / tile-px)."
    )
    min_tissue_fraction: float = setting(
        0.25, ge=0, le=1, help="Keep a grid cell when at least this fraction of it is tissue."
    )
    #: glass is ~240 on most scanners
    white_level: int = setting(
        220, ge=0, le=255,
        help="A pixel is near-white when R, G and B are all at least this (dark-background slides: "
        "near-black when its brightest channel is at most 255 minus this).",
    )  # fmt: skip
    max_background_fraction: float = setting(
        0.8, ge=0, le=1,
        help="Reject a tile when more than this fraction of its pixels is background (near-white; "
        "near-black on a dark-background slide).",
    )  # fmt: skip
    #: Sharp H&E at 1 um/px scores in the thousands (CMU-1: 2,000-10,000), a 1 um Gaussian blur
    #: 100-600, a 2 um blur 20-50 and a 4 um blur under 5.
    min_blur_variance: float = setting(
        50.0, ge=0,
        help="Reject a tile when its Laplacian variance (median over blocks) is below this; 0 = off.",
    )  # fmt: skip
    #: Counted in the file's own (JPEG) tiles, not ours (`wsi.tiff_tiles.FileDamage`): one bad 240 px
    #: JPEG tile spoils up to four 256 um tiles, 40% of a small slide's ten, yet it is one defect among
    #: the ~60 file tiles there. The few tiles it spoils are skipped and counted; a file mostly
    #: unreadable is an error worth seeing.
    max_unreadable_fraction: float = setting(
        0.05, ge=0, le=1,
        help="Fail the slide as damaged when more than this fraction of the file's own tiles under its "
        "tissue cannot be decoded (0: beyond one such tile).",
    )  # fmt: skip
    #: how the tissue mask is computed on the slide thumbnail (see wsi.tissue)
    tissue: TissueParams = field(default_factory=TissueParams)

    @property
    def target_mpp(self) -> float:
        return self.tile_um / self.tile_px

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings, `tissue` nested: what tile files store and a re-run compares."""
        return config_dict(self)

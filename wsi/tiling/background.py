"""Light or dark background: a brightfield slide (stain on white glass) or a fluorescence-like scan.

The tissue mask and the tile filters of an H&E pipeline assume glass is bright and tissue is coloured.
On a fluorescence scan (DAPI, FITC, TRITC, Cy5 ... channels) it is the other way round: no light where
there is no dye, bright signal where there is. Run the H&E filters on such a slide and every tissue tile
is "blurry" (the luminance weights hide the blue DAPI signal, and the black between nuclei is counted as
flat tissue), so the slide silently keeps nothing. `detect_background` tells the two apart from the
thumbnail's pixels and, where the file says so, its metadata; the tile stage then measures tissue,
background and focus the way that fits (`wsi.tiling.tissue.tissue_mask(dark=)`,
`wsi.tiling.grid.classify_tiles(dark=)`).

Metadata hints (any property value): OME-XML `IlluminationType="Epifluorescence"` or
`ContrastMethod="Fluorescence"` (OME data model, `<Channel>`), and common fluorophore / channel names
(DAPI, FITC, TRITC, Cy3, Cy5, Hoechst, Alexa Fluor, Opal ...) as NDPI, OME-TIFF, QPTIFF and Aperio FL
files name their channels. Pixels alone decide a slide without such metadata (e.g. our generated ones).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

BackgroundKind = Literal["light", "dark"]
#: what the user may ask for: detect per slide, or force one kind on every slide
BACKGROUND_CHOICES = ("auto", "light", "dark")

#: a thumbnail whose median brightness (max of R, G, B) is below this is mostly dark: not glass under
#: transmitted light (glass is ~240; H&E tissue's brightest channel is rarely under 120)
_DARK_MEDIAN = 64
#: with fluorescence hints in the metadata, a median below this is enough (dense tissue raises it)
_DARK_MEDIAN_WITH_METADATA = 128
#: ...but never dark when this fraction of the thumbnail is near-white glass (a brightfield slide with
#: black out-of-scan borders or a large pen mark still shows its glass)
_MAX_GLASS_FRACTION = 0.10
_GLASS_LEVEL = 200  # min of R, G, B at least this: near-white glass

_HINT = re.compile(
    r"\b(epifluorescence|fluorescence|DAPI|FITC|TRITC|Cy[2357](?:\.5)?|Hoechst|Alexa\s?Fluor|AF\d{3}"
    r"|Opal\s?\d{3}|Texas\s?Red|[em]?GFP|mCherry)\b",
    re.IGNORECASE,
)
#: property values longer than this are searched only at their start (OME-XML can be megabytes)
_MAX_SEARCH_CHARS = 200_000
#: a dark slide whose bright tissue (99th percentile of the thumbnail's brightest channel over the tissue
#: mask) is dimmer than this is brightened to it for the blur test: the Laplacian grows with the square of
#: the exposure, so a dim scan would otherwise look blurry. Our generated fluorescence slides sit at ~85.
_SIGNAL_REFERENCE = 64.0
#: ... by at most this factor, so that the noise of a nearly empty scan is not blown up into "sharp"
_MAX_GAIN = 4.0


@dataclass(frozen=True)
class Background:
    """What a slide's background is and why we think so (the reason goes to the log and the tile file)."""

    kind: BackgroundKind
    reason: str
    #: dark slides: factor on the brightest channel before the blur test (`with_signal_gain`)
    gain: float = 1.0
    #: fraction of the thumbnail that is near-white glass, and its median brightness (0-255): together
    #: they say whether a slide taken as light might be a dark one after all (`looks_dark_maybe`)
    glass_fraction: float = 1.0
    median_brightness: float = 255.0
    #: dark slides: a tile pixel brighter than this is signal (`wsi.tiling.dark_noise.tile_signal_level`);
    #: None: 255 - white_level, the level of a well exposed slide
    signal_level: int | None = None

    @property
    def dark(self) -> bool:
        return self.kind == "dark"


def with_signal_gain(background: Background, thumb: np.ndarray, mask: np.ndarray) -> Background:
    """`background` with the gain that brings a dim dark slide's tissue signal to _SIGNAL_REFERENCE.

    One gain per slide, not per tile: blur lowers a tile's peaks, so scaling each tile to its own peak
    would make blurred tiles look sharp.
    """
    if not mask.any():
        return background
    high = np.maximum(np.maximum(thumb[..., 0], thumb[..., 1]), thumb[..., 2])
    level = float(np.percentile(high[mask], 99))
    gain = float(np.clip(_SIGNAL_REFERENCE / max(level, 1.0), 1.0, _MAX_GAIN))
    if gain == 1.0:
        return background
    reason = f"{background.reason}; dim signal ({level:.0f} of 255): brightened {gain:.2g}x for the blur test"
    return dataclasses.replace(background, gain=gain, reason=reason)


def fluorescence_hints(properties: Mapping[str, str]) -> list[str]:
    """Distinct fluorescence words found in a slide's metadata (e.g. ["DAPI", "FITC"]), in order found."""
    found: list[str] = []
    for value in properties.values():
        for match in _HINT.finditer(str(value)[:_MAX_SEARCH_CHARS]):
            word = match.group(0)
            if word.casefold() not in (w.casefold() for w in found):
                found.append(word)
    return found


def detect_background(
    thumb: np.ndarray, properties: Mapping[str, str] | None = None, *, choice: str = "auto"
) -> Background:
    """Light or dark background of a slide from its (h, w, 3) uint8 thumbnail and its metadata.

    choice: "auto" detects; "light" or "dark" forces that kind (the reason then says so).
    """
    if choice not in BACKGROUND_CHOICES:
        raise ValueError(f"background must be one of {', '.join(BACKGROUND_CHOICES)}, not {choice!r}")
    rgb = thumb[..., :3]
    high = np.maximum(np.maximum(rgb[..., 0], rgb[..., 1]), rgb[..., 2])
    low = np.minimum(np.minimum(rgb[..., 0], rgb[..., 1]), rgb[..., 2])
    median = float(np.median(high)) if high.size else 255.0
    glass = float(np.count_nonzero(low >= _GLASS_LEVEL)) / max(1, low.size)
    hints = fluorescence_hints(properties or {})
    limit = _DARK_MEDIAN_WITH_METADATA if hints else _DARK_MEDIAN
    seen = f"median brightness {median:.0f} of 255, {glass:.0%} near-white glass"
    if hints:
        seen += f"; metadata names {', '.join(hints[:4])}"
    kind: BackgroundKind = "dark" if median < limit and glass <= _MAX_GLASS_FRACTION else "light"
    what = "dark background, fluorescence-like" if kind == "dark" else "light background, brightfield"
    if choice != "auto":
        kind = "dark" if choice == "dark" else "light"
        what = f"{kind} background, set by --background {choice}"
    return Background(kind, f"{what} ({seen})", glass_fraction=glass, median_brightness=median)


def looks_dark_maybe(background: Background) -> bool:
    """A slide taken as light that shows almost no glass and is fairly dark: worth suggesting
    --background dark when it keeps no tile."""
    return (
        not background.dark
        and background.glass_fraction <= _MAX_GLASS_FRACTION
        and background.median_brightness < _DARK_MEDIAN_WITH_METADATA
    )

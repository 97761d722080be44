"""Where a bag's tiles lie: micrometre coordinates and tile size from each layout's own facts.

Ours and STAMP's bags store micrometres. CLAM's and TRIDENT's store level-0 pixels, placed in
micrometres only with the slide's level-0 resolution (`_pixel_mpp`: given, a bag attribute, or
TRIDENT's nominal magnification). Without one the coordinates stay in pixels: fine for a model that
uses no tile positions, an error naming the bag and the options that fix it for one that does. The
tile side comes from an attribute or the coordinate grid (`_pixel_tile_px0`). Each derivation is
logged once per bag at INFO, so a run's log says where its micrometres came from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wsi.core.errors import BagFormatError
from wsi.core.json_types import JsonObject, JsonValue

log = logging.getLogger(__name__)

#: coordinate units of STAMP bags that mean micrometres
_UM_UNITS = ("um", "micron", "microns")
#: (bag, message) pairs already logged: a training epoch reloads every bag, the log says it once
_SAID: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Placement:
    """A bag's tile positions in micrometres (None when they cannot be known) and how they were found."""

    coords_um: np.ndarray | None  # (N, 2) float32 top-left in micrometres
    tile_um: float | None  # tile side in micrometres
    mpp: float | None  # the slide's level-0 um/px, when known
    mpp_source: str  # "given", "bag attribute mpp", "TRIDENT level0_magnification=40 (nominal)", ""
    tile_px0: float | None = None  # tile side in level-0 px (pixel layouts), when known


def say_once(path: Path, message: str) -> None:
    """Log `message` about bag `path` at INFO, once per process."""
    key = (str(path), message)
    if key not in _SAID:
        _SAID.add(key)
        log.info("%s: %s", path, message)


def grid_step(coords: np.ndarray) -> float | None:
    """The most common positive step between distinct x (and y) tile positions; None for one tile.

    On a regular grid that is the grid stride, which equals the tile side when tiles do not overlap
    (the default of CLAM, TRIDENT, STAMP and ours). Ties go to the smaller step.
    """
    coords = np.asarray(coords, dtype=np.float64)
    if coords.ndim != 2 or len(coords) < 2:
        return None
    steps = [np.diff(np.unique(np.round(coords[:, axis], 3))) for axis in range(coords.shape[1])]
    diffs = np.round(np.concatenate(steps), 3)
    diffs = diffs[diffs > 0]
    if not diffs.size:
        return None
    values, counts = np.unique(diffs, return_counts=True)
    return float(values[counts.argmax()])


def _need(attrs: JsonObject, name: str, path: Path, layout: str, hint: str = "") -> float:
    """Attribute `name` as a number; BagFormatError naming it when it is absent or not a number."""
    value = attrs.get(name)
    if value is None:
        raise BagFormatError(
            f"{path} ({layout} layout) lacks the `{name}` attribute needed to place its tiles{hint}"
        )
    return _float(value, name, path, layout)


def _float(value: JsonValue, name: str, path: Path, layout: str) -> float:
    """A foreign file's attribute as one number (a number, or text that reads as one)."""
    try:
        if isinstance(value, int | float | str):
            return float(value)
    except ValueError:
        pass
    raise BagFormatError(f"{path} ({layout} layout): attribute `{name}` is {value!r}, not a number")


def _positive(value: JsonValue) -> float | None:
    """A number above 0, else None (absent, text, a list, NaN)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def place_um_layout(
    layout: str, coords: np.ndarray, attrs: JsonObject, path: Path, all_coords: Callable[[], np.ndarray]
) -> Placement:
    """Ours and STAMP's: coordinates are micrometres already; only the tile size may need finding."""
    mpp_f = _positive(attrs.get("mpp"))
    coords_um = np.asarray(coords, dtype=np.float32)
    if layout == "wsi":
        tile_um = _need(attrs, "tile_size_um", path, layout)
        return Placement(coords_um, tile_um, mpp_f, "bag attribute mpp" if mpp_f else "")
    unit = attrs.get("unit", "um")
    if unit not in _UM_UNITS:
        raise BagFormatError(f"{path} (stamp layout) has coords in unit {unit!r}; only um is known")
    if attrs.get("tile_size_um"):  # STAMP >= 2.1 (stamp/modeling/data.py:771-774)
        return Placement(coords_um, _need(attrs, "tile_size_um", path, layout), mpp_f, "")
    if attrs.get("tile_size") and attrs.get("unit") in _UM_UNITS:  # STAMP 2.0 (data.py:764-770)
        return Placement(coords_um, _need(attrs, "tile_size", path, layout), mpp_f, "")
    if attrs.get("unit") not in _UM_UNITS:  # the historic layout: units unknown, not guessed
        _need(attrs, "tile_size_um", path, layout, " (older STAMP bags: re-extract with STAMP>=2)")
    step = grid_step(all_coords())
    if step is not None:
        say_once(path, f"no tile size attribute; inferred {step:g} um from the coordinate grid")
    return Placement(coords_um, step, mpp_f, "")


def _trident_mpp(attrs: JsonObject, path: Path) -> tuple[float | None, str]:
    """10 / `level0_magnification`, as TRIDENT converts it (mahmoodlab/TRIDENT
    trident/wsi_objects/WSIPatcher.py:134-142, WSI.py:362): nominal, since TRIDENT bins the scanner's mpp
    into magnifications (WSI.py:301-320), so 0.3 um/px reads as 20x."""
    mag = attrs.get("level0_magnification")
    if not isinstance(mag, int | float) or not mag > 0:
        return None, ""
    mpp = 10.0 / float(mag)
    source = f"TRIDENT level0_magnification={mag:g} (nominal)"
    say_once(
        path,
        f"mpp {mpp:g} um/px derived from TRIDENT's level0_magnification={mag:g} as 10/magnification "
        "(nominal; give the scanner's value with --mpp or an `mpp` column to override it)",
    )
    return mpp, source


def _pixel_mpp(layout: str, attrs: JsonObject, path: Path, mpp: float | None) -> tuple[float | None, str]:
    """The level-0 um/px of a pixel layout, from the first of: the caller's `mpp` (a labels CSV `mpp`
    column, else --mpp), the bag's `mpp` attribute, TRIDENT's magnification."""
    if mpp is not None:
        return float(mpp), "given"
    given = _positive(attrs.get("mpp"))
    if given is not None:
        return given, "bag attribute mpp"
    if layout == "trident":
        return _trident_mpp(attrs, path)
    return None, ""


def _pixel_tile_px0(
    layout: str, attrs: JsonObject, path: Path, all_coords: Callable[[], np.ndarray]
) -> float | None:
    """Tile side of a CLAM / TRIDENT bag in level-0 px: from its attributes (TRIDENT `patch_size_level0`;
    CLAM `patch_size` x `downsample`), else the most common step of its grid (CLAM's feature bags carry
    no attributes at all: mahmoodlab/CLAM utils/file_utils.py:16-34)."""
    if layout == "trident" and attrs.get("patch_size_level0") is not None:
        return _need(attrs, "patch_size_level0", path, layout)
    if layout == "clam" and attrs.get("patch_size") is not None:  # a CLAM patches file's attributes
        level = int(_float(attrs.get("patch_level", 0), "patch_level", path, layout))
        downsample = attrs.get("downsample")
        if downsample is None:
            if level != 0:
                _need(attrs, "downsample", path, layout, f" (patch_level is {level})")
            downsample = 1.0
        if not isinstance(downsample, int | float | list):  # one factor, or one per axis
            raise BagFormatError(f"{path} ({layout} layout): attribute `downsample` is {downsample!r}")
        factor = float(np.mean(np.atleast_1d(np.asarray(downsample, dtype=np.float64))))
        return _need(attrs, "patch_size", path, layout) * factor
    overlap = attrs.get("overlap")
    if isinstance(overlap, int | float) and overlap > 0:  # the stride is then not the tile side
        say_once(path, f"tiles overlap by {overlap:g} px and no attribute gives their size; size unknown")
        return None
    step = grid_step(all_coords())
    if step is not None:
        say_once(path, f"no tile size attribute; inferred {step:g} level-0 px from the coordinate grid")
    return step


def place_pixel_layout(
    layout: str,
    coords: np.ndarray,
    attrs: JsonObject,
    path: Path,
    all_coords: Callable[[], np.ndarray],
    *,
    mpp: float | None,
    require_um: bool,
) -> Placement:
    """CLAM's and TRIDENT's level-0 pixel coordinates in micrometres, when the resolution is known."""
    size_px0 = _pixel_tile_px0(layout, attrs, path, all_coords)
    level0_mpp, source = _pixel_mpp(layout, attrs, path, mpp)
    if level0_mpp is None:
        if require_um:
            what = " and no `level0_magnification`" if layout == "trident" else ""
            raise BagFormatError(
                f"{path} ({layout} layout) stores tile coordinates in level-0 pixels, with no `mpp` "
                f"attribute{what}; the model uses tile positions, so give the slide's level-0 um/px: "
                "--mpp (every slide) or an `mpp` column in the labels CSV (per slide); in code, "
                "read_bag(path, mpp=...)"
            )
        return Placement(None, None, None, "", size_px0)
    coords_um = (np.asarray(coords, dtype=np.float64) * level0_mpp).astype(np.float32)
    size_um = size_px0 * level0_mpp if size_px0 is not None else None
    return Placement(coords_um, size_um, level0_mpp, source, size_px0)

"""One `Slide` type over openslide and tiffslide, addressed in micrometres.

`Slide.read_region_um` is the ONE function that turns slide pixels into tiles: tiling, embedding and
prediction all call it, so a tile of `size_um` at `target_mpp` looks the same in every stage whatever
pyramid the scanner wrote. It reads from the cheapest level at least as fine as asked and resizes with
an antialiasing filter; parts outside the slide come back white (glass), never an error.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np
from PIL import Image

from wsi.errors import ConfigError, MissingMppError, SlideError

log = logging.getLogger(__name__)

Backend = Literal["openslide", "tiffslide"]
_XY = tuple[int, int]
BACKENDS: tuple[str, ...] = ("openslide", "tiffslide")

#: a level counts as "at least as fine" as the target when its um/px is within this fraction above it
#: (scanners write downsamples like 4.0005, which must still serve a target of 4 x level 0)
LEVEL_TOLERANCE = 0.01
#: scale error accepted to read a level directly (or reduce it by a whole factor) instead of resampling:
#: 0.3% is under 1.5 px across a 512 px tile, and serves the common 0.499 / 0.2527 um/px scans at the
#: usual 0.5 / 1.0 / 2.0 targets at the raw read rate
SNAP_TOLERANCE = 0.003
#: resolution tags outside this range (um/px) are defaults such as 72 dpi, not a scan resolution
_PLAUSIBLE_MPP = (0.01, 50.0)
_WHITE = 255
#: thumbnails from a level larger than this (pixels) are assembled block by block (memory)
_MAX_THUMB_READ_PX = 1 << 26
_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


def _mpp_hint(path: Path) -> str:
    return (
        f"{path}: the slide has no resolution (um/px) in its metadata; give it with --mpp "
        "(e.g. --mpp 0.25 for a 40x scan, 0.5 for 20x) or an `mpp` column in the slide list CSV"
    )


class Slide:
    """An open whole-slide image. Use `open_slide`; close it (or use `with`) to free the file."""

    path: Path
    backend: str
    vendor: str
    mpp: float  # level-0 um/px
    dimensions: tuple[int, int]  # (width, height) of level 0, px
    level_dimensions: tuple[tuple[int, int], ...]
    level_downsamples: tuple[float, ...]
    properties: dict[str, str]

    def __init__(self, path: Path, backend: str, mpp: float | None) -> None:
        self.path = path
        self.backend = backend
        self._handle: Any = None
        self._open_handle()
        h = self._handle
        self.properties = {str(k): str(v) for k, v in dict(h.properties).items() if v is not None}
        self.vendor = str(self.properties.get(f"{backend}.vendor") or "generic")
        self.dimensions = tuple(int(v) for v in h.dimensions)  # type: ignore[assignment]
        self.level_dimensions = tuple((int(w), int(hh)) for w, hh in h.level_dimensions)
        self.level_downsamples = tuple(float(d) for d in h.level_downsamples)
        if mpp is not None:
            if not (isinstance(mpp, int | float) and math.isfinite(mpp) and mpp > 0):
                self.close()
                raise SlideError(f"{path}: mpp must be a positive number of um/px, not {mpp!r}")
            self.mpp = float(mpp)
            found = self._mpp_from_metadata()
            if found is not None and abs(found - self.mpp) > 0.01 * found:
                log.info("%s: using the given mpp %.4g instead of %.4g from its metadata", path, mpp, found)
        else:
            found = self._mpp_from_metadata()
            if found is None:
                self.close()
                raise MissingMppError(_mpp_hint(path))
            self.mpp = found

    # ------------------------------------------------------------------------------------------- open
    def _open_handle(self) -> None:
        self._handle = self._new_handle()

    def _new_handle(self) -> Any:
        try:
            if self.backend == "openslide":
                import openslide

                return openslide.OpenSlide(self.path)
            import tiffslide

            return tiffslide.TiffSlide(self.path)
        except Exception as exc:  # each backend raises its own types; the user needs file + reason
            raise SlideError(
                f"{self.path}: not a slide {self.backend} can read ({type(exc).__name__}: {exc}); "
                "check that the file is a complete whole-slide image (e.g. .svs, .tiff, .ndpi, .mrxs)"
            ) from exc

    def _mpp_from_metadata(self) -> float | None:
        """Backend mpp property, else the TIFF resolution tags of level 0 (cm or inch units)."""
        props = self.properties
        for key in (f"{self.backend}.mpp-x", "openslide.mpp-x", "tiffslide.mpp-x"):
            value = _positive_float(props.get(key))
            if value is not None:
                y = _positive_float(props.get(key.replace("mpp-x", "mpp-y")))
                if y is not None and abs(y - value) > 0.01 * value:
                    log.warning("%s: mpp-x %.4g differs from mpp-y %.4g; using mpp-x", self.path, value, y)
                return value
        return _mpp_from_tiff_tags(self.path)

    # ------------------------------------------------------------------------------------------- read
    def level_mpp(self, level: int) -> float:
        """um/px of a pyramid level."""
        return self.mpp * self.level_downsamples[level]

    def best_level_for_mpp(self, target_mpp: float) -> int:
        """The cheapest (coarsest) level whose um/px is at most `target_mpp` (within LEVEL_TOLERANCE)."""
        best = 0
        for level in range(len(self.level_downsamples)):
            lm = self.level_mpp(level)
            if lm <= target_mpp * (1 + LEVEL_TOLERANCE) and lm > self.level_mpp(best):
                best = level
        return best

    def read_level(self, level: int, x_px: int, y_px: int, w_px: int, h_px: int) -> np.ndarray:
        """(h, w, 3) uint8 RGB of a rectangle given in LEVEL pixels; outside the slide is white.

        The raw read under `read_region_um`, exposed for benchmarks that compare against it. On levels
        with a non-integer downsample, openslide's pixels may sit up to half a pixel off (it resamples);
        `read_region_um` corrects for that.
        """
        where = f"level {level} at x={x_px} y={y_px} (level px)"
        return self._read(level, x_px, y_px, w_px, h_px, where)[0]

    def _read(
        self, level: int, x_px: int, y_px: int, w_px: int, h_px: int, where: str
    ) -> tuple[np.ndarray, float, float]:
        """Pixels of a level rectangle, and where (in level px) the backend's pixel grid really started."""
        lw, lh = self.level_dimensions[level]
        cx0, cy0 = max(0, x_px), max(0, y_px)
        cx1, cy1 = min(lw, x_px + w_px), min(lh, y_px + h_px)
        if cx0 >= cx1 or cy0 >= cy1:
            return np.full((h_px, w_px, 3), _WHITE, np.uint8), 0.0, 0.0
        ds = self.level_downsamples[level]
        size = (cx1 - cx0, cy1 - cy0)
        if self.backend == "openslide":
            # openslide maps the level-0 location to level px as loc / downsample, fraction included
            loc = (round(cx0 * ds), round(cy0 * ds))
            shift = (loc[0] / ds - cx0, loc[1] / ds - cy0)
        else:
            # tiffslide takes int(loc / downsample): pick the loc that lands exactly on (cx0, cy0)
            loc = (_loc_for(cx0, ds), _loc_for(cy0, ds))
            shift = (0.0, 0.0)
        try:
            part = self._read_backend(self._handle, loc, level, size)
        except Exception as exc:
            if self.backend != "openslide":
                raise SlideError(f"{self.path}: cannot read {where}: {type(exc).__name__}: {exc}") from exc
            # An openslide handle stays in its error state after a failed read, also for other threads
            # reading it, so the failure may be someone else's: retry on a private fresh handle, and
            # swap a fresh one in for everybody. Only a truly bad region fails.
            part = self._retry_openslide(loc, level, size, where)
        if (cx1 - cx0, cy1 - cy0) == (w_px, h_px):
            return np.ascontiguousarray(part), shift[0], shift[1]
        out = np.full((h_px, w_px, 3), _WHITE, np.uint8)  # partly outside the slide: white glass
        out[cy0 - y_px : cy1 - y_px, cx0 - x_px : cx1 - x_px] = part
        return out, shift[0], shift[1]

    def _read_backend(self, handle: Any, loc: _XY, level: int, size: _XY) -> np.ndarray:
        if self.backend == "openslide":
            return _rgba_over_white(np.asarray(handle.read_region(loc, level, size)))
        return handle.read_region(loc, level, size, as_array=True)[..., :3]

    def _retry_openslide(self, loc: _XY, level: int, size: _XY, where: str) -> np.ndarray:
        fresh = self._new_handle()
        try:
            part = self._read_backend(fresh, loc, level, size)
        except Exception as exc:
            fresh.close()
            self._handle = self._new_handle()  # the old one is poisoned; it is freed when unused
            raise SlideError(f"{self.path}: cannot read {where}: {type(exc).__name__}: {exc}") from exc
        self._handle = fresh
        return part

    def read_region_um(self, x0_px: int, y0_px: int, size_um: float, target_mpp: float) -> np.ndarray:
        """(P, P, 3) uint8 RGB of the square of `size_um` whose top-left is (x0_px, y0_px) at level 0.

        P = round(size_um / target_mpp). Read from `best_level_for_mpp(target_mpp)`, then resized with
        an antialiasing filter; regions partly outside the slide are padded white.
        """
        if size_um <= 0 or target_mpp <= 0:
            raise ValueError(f"size_um ({size_um}) and target_mpp ({target_mpp}) must be positive")
        p = round(size_um / target_mpp)
        if p < 1:
            raise ValueError(f"size_um {size_um} at target_mpp {target_mpp} is less than one pixel")
        level = self.best_level_for_mpp(target_mpp)
        where = f"a {size_um:g} um region at level-0 x={x0_px} y={y0_px} (level {level})"
        ds = self.level_downsamples[level]
        lx, ly = x0_px / ds, y0_px / ds  # top-left in level pixels (float)
        side = size_um / self.level_mpp(level)  # region side in level pixels (float)
        ix, iy = math.floor(lx + 1e-6), math.floor(ly + 1e-6)
        # openslide shifts levels with a non-integer downsample by a fraction of a pixel
        exact_grid = self.backend != "openslide" or float(ds).is_integer()
        k = max(1, round(side / p))
        if exact_grid and abs(side - k * p) <= SNAP_TOLERANCE * side and lx - ix < 1e-3 and ly - iy < 1e-3:
            # the region sits on the level's pixel grid and the level is (within SNAP_TOLERANCE) the target
            # or a whole multiple of it: read k*P px and average k x k blocks, no general resampling
            raw = self._read(level, ix, iy, k * p, k * p, where)[0]
            return raw if k == 1 else np.asarray(Image.fromarray(raw).reduce(k))
        # one pixel of margin where the backend's grid may be shifted, so it still covers the region
        margin = 0 if exact_grid else 1
        ix, iy = ix - margin, iy - margin
        n_w = math.ceil(lx - ix + side - 1e-6) + margin
        n_h = math.ceil(ly - iy + side - 1e-6) + margin
        raw, sx, sy = self._read(level, ix, iy, n_w, n_h, where)
        bx, by = max(0.0, lx - ix - sx), max(0.0, ly - iy - sy)  # region top-left within `raw`
        off_grid = max(abs(bx - round(bx)), abs(by - round(by)))
        img = Image.fromarray(raw).resize(
            (p, p), resample=_filter_for(side / p, off_grid), box=(bx, by, bx + side, by + side)
        )
        return np.asarray(img)

    def thumbnail_at(self, mpp: float) -> np.ndarray:
        """The whole slide as RGB uint8 at about `mpp` um/px, read from the coarsest level fine enough."""
        if mpp <= 0:
            raise ValueError(f"thumbnail mpp must be positive, not {mpp}")
        level = self.best_level_for_mpp(mpp)
        lw, lh = self.level_dimensions[level]
        w0, h0 = self.dimensions
        size = (max(1, round(w0 * self.mpp / mpp)), max(1, round(h0 * self.mpp / mpp)))
        if lw * lh > _MAX_THUMB_READ_PX:
            return self._thumbnail_by_blocks(mpp, size)
        raw = self.read_level(level, 0, 0, lw, lh)
        if size == (lw, lh):
            return raw
        return np.asarray(Image.fromarray(raw).resize(size, resample=_filter_for(lw / size[0])))

    def _thumbnail_by_blocks(self, mpp: float, size: tuple[int, int], read_px: int = 4096) -> np.ndarray:
        """Thumbnail of a slide whose suitable level is too big to read at once (no pyramid).

        Blocks are sized so that each read is at most `read_px` pixels a side at the level read.
        """
        level = self.best_level_for_mpp(mpp)
        block_px = max(1, int(read_px * self.level_mpp(level) / mpp))  # thumbnail px per block
        out = np.empty((size[1], size[0], 3), np.uint8)
        for by in range(0, size[1], block_px):
            for bx in range(0, size[0], block_px):
                block = self.read_region_um(round(bx * mpp / self.mpp), round(by * mpp / self.mpp),
                                            block_px * mpp, mpp)
                out[by : by + block_px, bx : bx + block_px] = block[: size[1] - by, : size[0] - bx]
        return out

    # ------------------------------------------------------------------------------------------- life
    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> Slide:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        w, h = self.dimensions
        return f"Slide({str(self.path)!r}, backend={self.backend!r}, {w}x{h} px, mpp={self.mpp:.4g})"


def open_slide(
    path: str | os.PathLike[str], *, backend: Backend | str = "openslide", mpp: float | None = None
) -> Slide:
    """Open a whole-slide image.

    backend: "openslide" (default) or "tiffslide"; anything else raises ConfigError.
    mpp: level-0 um/px, overriding the metadata (needed for slides that carry none).
    Raises SlideError (missing, empty, not a slide, truncated) or MissingMppError.
    A Slide may be shared by threads for reading (both backends read thread-safely).
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown slide backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    path = Path(path)
    if not path.exists():
        raise SlideError(f"{path}: slide file not found")
    if path.is_dir():
        raise SlideError(f"{path}: is a folder, not a slide file (MIRAX .mrxs: give the .mrxs file)")
    if path.stat().st_size == 0:
        raise SlideError(f"{path}: the file is empty (0 bytes); copy or download it again")
    _check_tiff_complete(path)
    return Slide(path, backend, mpp)


# ----------------------------------------------------------------------------------------------- helpers
def _filter_for(reduction: float, off_grid: float = 0.0) -> Image.Resampling:
    """Resampling filter for shrinking by `reduction` (input px per output px), the box `off_grid` px
    away from the input's pixel grid.

    PIL widens every filter by the reduction factor, so all of these antialias. Area averaging (BOX) is
    exact and about 4x cheaper than Lanczos for whole-number reductions on the pixel grid (2x, 4x); off
    the grid BOX snaps to whole pixels, so the triangle filter (smooth in sub-pixel shifts) is used;
    bicubic when enlarging.
    """
    on_grid = abs(reduction - round(reduction)) < 1e-3 and off_grid < 1e-3
    if reduction >= 1.0 and on_grid:
        return Image.Resampling.BOX
    if reduction >= 1.0:
        return Image.Resampling.BILINEAR
    return Image.Resampling.BICUBIC


def _positive_float(value: object) -> float | None:
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f > 0 else None


def _rgba_over_white(rgba: np.ndarray) -> np.ndarray:
    """openslide's RGBA (un-premultiplied; transparent = no data) composited over white glass."""
    rgb = rgba[..., :3]
    alpha = rgba[..., 3]
    if alpha.min() == 255:
        return rgb
    a = alpha[..., None].astype(np.float32) / 255.0
    return (rgb.astype(np.float32) * a + 255.0 * (1.0 - a) + 0.5).astype(np.uint8)


def _loc_for(level_px: int, downsample: float) -> int:
    """The level-0 coordinate that tiffslide (int(loc / downsample)) maps to exactly `level_px`."""
    loc = math.ceil(level_px * downsample)
    while loc > 0 and int((loc - 1) / downsample) == level_px:
        loc -= 1
    while int(loc / downsample) < level_px:
        loc += 1
    return loc


def _is_tiff(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) in _TIFF_MAGIC


def _check_tiff_complete(path: Path) -> None:
    """A TIFF whose IFDs or tile data run past the end of the file is truncated: say so at open time."""
    if not _is_tiff(path):
        return
    import tifffile

    size = path.stat().st_size
    try:
        with tifffile.TiffFile(path) as tif:
            end = 0
            for page in tif.pages:
                offsets = page.dataoffsets  # type: ignore[union-attr]
                counts = page.databytecounts  # type: ignore[union-attr]
                if len(offsets):
                    end = max(end, max(o + c for o, c in zip(offsets, counts, strict=False)))
    except Exception:  # a TIFF variant tifffile does not parse: let the backend decide
        log.debug("%s: tifffile could not check the TIFF structure", path, exc_info=True)
        return
    if end > size:
        raise SlideError(
            f"{path}: the file is truncated ({size} bytes, but its image data runs to byte {end}); "
            "copy or download it again"
        )


def _mpp_from_tiff_tags(path: Path) -> float | None:
    """um/px from level-0 XResolution/YResolution + ResolutionUnit (centimetre or inch only)."""
    if not _is_tiff(path):
        return None
    import tifffile

    try:
        with tifffile.TiffFile(path) as tif:
            tags = tif.pages[0].tags  # type: ignore[union-attr]
            unit = tags.get("ResolutionUnit")
            xres = tags.get("XResolution")
            if unit is None or xres is None:
                return None
            unit_um = {2: 25400.0, 3: 10000.0}.get(int(unit.value))
            num, den = xres.value if isinstance(xres.value, tuple) else (xres.value, 1)
    except Exception:
        return None
    if unit_um is None or not num or not den:
        return None
    mpp = unit_um * den / num
    lo, hi = _PLAUSIBLE_MPP
    return mpp if lo <= mpp <= hi else None

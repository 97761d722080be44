"""One `Slide` type over openslide and tiffslide, addressed in micrometres.

`Slide.read_region_um` is the ONE function that turns slide pixels into tiles: tiling, embedding and
prediction all call it, so a tile of `side_um` at `target_mpp` looks the same in every stage whatever
pyramid the scanner wrote. Its level, window and filter are planned by `wsi.slides.region.plan_region`,
which the embed stage's device decoder follows too; parts outside the slide come back white, never an error.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import numpy as np
from PIL import Image

from wsi.core.errors import ConfigError, MissingMppError, SlideError
from wsi.core.renamed import renamed_keywords
from wsi.core.suffixes import NAMED_SLIDE_SUFFIXES
from wsi.slides.plain_images import ImageHeader, is_image_slide, open_image
from wsi.slides.region import RegionKind, RegionPlan, best_level, check_tile_out, plan_region, tiffslide_loc
from wsi.slides.slide_colour import ColourFix, check_colours
from wsi.slides.stored_tiles import JpegTiles, jpeg_levels
from wsi.slides.tiff_header import is_tiff, mpp_from_tiff_tags
from wsi.storage.slides import RangeFile, check_complete, remote_slide
from wsi.storage.urls import Url, is_url, parse_url

log = logging.getLogger(__name__)

Backend = Literal["openslide", "tiffslide"]
_XY = tuple[int, int]
BACKENDS: tuple[str, ...] = ("openslide", "tiffslide")
_WHITE = 255
#: openslide vendors whose levels are the TIFF's tiled pages, read as they are (`wsi.slides.stored_tiles`)
_DIRECT_VENDORS = frozenset({"aperio", "generic-tiff"})


def _mpp_hint(path: Path | Url) -> str:
    return (
        f"{path}: the slide has no resolution (um/px) in its metadata; give it with --mpp "
        "(e.g. --mpp 0.25 for a 40x scan, 0.5 for 20x) or an `mpp` column in the slide list CSV"
    )


class Slide:
    """An open whole-slide image. Use `open_slide`; close it (or use `with`) to free the file."""

    path: Path | Url  # the slide as the user named it: a local file, or a URL (s3://, gs://, https://)
    #: what is read: the local file (for a URL: its copy in the local cache), or a remote file read by ranges
    file: Path | RangeFile
    backend: str
    vendor: str
    mpp: float  # level-0 um/px
    mpp_source: str  # "given", "metadata (openslide.mpp-x)", "TIFF resolution tags"
    dimensions: tuple[int, int]  # (width, height) of level 0, px
    level_dimensions: tuple[tuple[int, int], ...]
    level_downsamples: tuple[float, ...]
    properties: dict[str, str]
    colour_fix: ColourFix  # levels whose JPEG tiles the backend decodes in the wrong colour space
    #: a plain image (PNG, JPEG, TIFF in strips) read from its pyramid in the cache (`file`); else None
    image: ImageHeader | None

    def __init__(
        self,
        path: Path | Url,
        backend: str,
        mpp: float | None,
        jpeg: dict[_XY, JpegTiles] | None = None,
        *,
        file: Path | RangeFile | None = None,
        hold: IO[str] | None = None,
        image: ImageHeader | None = None,
    ) -> None:
        self.path = path
        self.image = image
        self.file = file if file is not None else Path(path)
        # a remote slide's local copy stays in the cache while this slide is open (openslide re-opens it);
        # released by close()
        self._hold = hold
        self.backend = backend
        self._direct: dict[int, JpegTiles] = {}
        h = self._new_handle()
        self._handle: Any = h
        self.properties = {str(k): str(v) for k, v in dict(h.properties).items() if v is not None}
        self.vendor = str(self.properties.get(f"{backend}.vendor") or "generic")
        if image is not None:
            self.vendor = f"plain-{image.format.lower()}"
        width, height = h.dimensions
        self.dimensions = (int(width), int(height))
        self.level_dimensions = tuple((int(w), int(hh)) for w, hh in h.level_dimensions)
        self.level_downsamples = tuple(float(d) for d in h.level_downsamples)
        try:
            self.colour_fix = check_colours(self.file, backend, self.vendor, self.level_dimensions)
        except SlideError:
            self.close()
            raise
        if jpeg and backend == "openslide" and self.vendor in _DIRECT_VENDORS:
            # openslide reads these formats' levels page by page: decode their JPEG tiles directly, where
            # openslide decodes them as their tag says (a level the colour fix converts stays with it)
            self._direct = {
                i: jpeg[dims]
                for i, dims in enumerate(self.level_dimensions)
                if dims in jpeg and i not in self.colour_fix.levels
            }
            for tiles in self._direct.values():
                tiles.open()  # now, as openslide's handle: a cache copy evicted later stays readable
        if mpp is not None:
            if not (isinstance(mpp, int | float) and math.isfinite(mpp) and mpp > 0):
                self.close()
                raise SlideError(f"{path}: mpp must be a positive number of um/px, not {mpp!r}")
            self.mpp, self.mpp_source = float(mpp), "given"
            found, _ = self._mpp_from_metadata()
            if found is not None and abs(found - self.mpp) > 0.01 * found:
                log.info("%s: using the given mpp %.4g instead of %.4g from its metadata", path, mpp, found)
        else:
            found, source = self._mpp_from_metadata()
            if found is None:
                self.close()
                raise MissingMppError(_mpp_hint(path))
            self.mpp, self.mpp_source = found, source

    # ------------------------------------------------------------------------------------------- open
    def _new_handle(self) -> Any:
        try:
            if self.backend == "openslide":
                import openslide

                if isinstance(self.file, RangeFile):  # remote_slide gives openslide a local copy
                    raise TypeError("openslide reads local files only")
                return openslide.OpenSlide(self.file)
            import tiffslide

            source: Any = self.file.open() if isinstance(self.file, RangeFile) else self.file
            return tiffslide.TiffSlide(source)
        except Exception as exc:  # each backend raises its own types; the user needs file + reason
            raise SlideError(
                f"{self.path}: not a slide {self.backend} can read ({type(exc).__name__}: {exc}); "
                f"check that the file is a complete slide or image ({' '.join(NAMED_SLIDE_SUFFIXES)})"
            ) from exc

    def _mpp_from_metadata(self) -> tuple[float | None, str]:
        """Backend mpp property, else the TIFF resolution tags of level 0 (cm or inch units); and which.
        A plain image's: what its own header says (`wsi.slides.plain_images.header`), never its pyramid's."""
        if self.image is not None:
            return self.image.mpp, self.image.mpp_source
        props = self.properties
        for key in (f"{self.backend}.mpp-x", "openslide.mpp-x", "tiffslide.mpp-x"):
            value = _positive_float(props.get(key))
            if value is not None:
                y = _positive_float(props.get(key.replace("mpp-x", "mpp-y")))
                if y is not None and abs(y - value) > 0.01 * value:
                    log.warning("%s: mpp-x %.4g differs from mpp-y %.4g; using mpp-x", self.path, value, y)
                return value, f"metadata ({key})"
        tags = mpp_from_tiff_tags(self.file)
        return tags, "TIFF resolution tags" if tags is not None else ""

    # ------------------------------------------------------------------------------------------- read
    def level_mpp(self, level: int) -> float:
        """um/px of a pyramid level."""
        return self.mpp * self.level_downsamples[level]

    def best_level_for_mpp(self, target_mpp: float) -> int:
        """The cheapest (coarsest) level whose um/px is at most `target_mpp`
        (`wsi.slides.region.best_level`)."""
        return best_level(self.mpp, self.level_downsamples, target_mpp)

    def read_level(self, level: int, x_px: int, y_px: int, w_px: int, h_px: int) -> np.ndarray:
        """(h, w, 3) uint8 RGB of a rectangle given in LEVEL pixels; outside the slide is white.

        The raw read under `read_region_um`, exposed for benchmarks that compare against it. On levels
        with a non-integer downsample, openslide's pixels may sit up to half a pixel off (it resamples);
        `read_region_um` corrects for that.
        """
        where = f"level {level} at x={x_px} y={y_px} (level px)"
        return self._read(level, x_px, y_px, w_px, h_px, where)[0]

    def _read(
        self, level: int, x_px: int, y_px: int, w_px: int, h_px: int, where: str,
        out: np.ndarray | None = None,
    ) -> tuple[np.ndarray, float, float]:  # fmt: skip
        """Pixels of a level rectangle (in `out`, a C-contiguous (h, w, 3) uint8 array, when given), and
        where (in level px) the backend's pixel grid really started."""
        lw, lh = self.level_dimensions[level]
        cx0, cy0 = max(0, x_px), max(0, y_px)
        cx1, cy1 = min(lw, x_px + w_px), min(lh, y_px + h_px)
        if cx0 >= cx1 or cy0 >= cy1:
            return _white(out, w_px, h_px), 0.0, 0.0
        ds = self.level_downsamples[level]
        size = (cx1 - cx0, cy1 - cy0)
        whole = size == (w_px, h_px)
        if self.backend == "openslide":
            # openslide maps the level-0 location to level px as loc / downsample, fraction included
            loc = (round(cx0 * ds), round(cy0 * ds))
            shift = (loc[0] / ds - cx0, loc[1] / ds - cy0)
        else:
            # tiffslide takes int(loc / downsample): pick the loc that lands exactly on (cx0, cy0)
            loc = (tiffslide_loc(cx0, ds), tiffslide_loc(cy0, ds))
            shift = (0.0, 0.0)
        direct = self._direct.get(level)
        if direct is not None and shift == (0.0, 0.0):  # openslide would read these very pixels
            # decoded in place: into `out` itself, or the part of it inside the level
            dest = out if whole else _white(out, w_px, h_px)
            inside = dest if whole or dest is None else dest[cy0 - y_px : cy1 - y_px, cx0 - x_px : cx1 - x_px]
            try:
                part = direct.read(cx0, cy0, *size, out=inside)
            except Exception as exc:
                raise SlideError(f"{self.path}: cannot read {where}: {type(exc).__name__}: {exc}") from exc
            return (part if dest is None else dest), 0.0, 0.0
        try:
            part = self._read_backend(self._handle, loc, level, size)
        except Exception as exc:
            if self.backend != "openslide":
                raise SlideError(f"{self.path}: cannot read {where}: {type(exc).__name__}: {exc}") from exc
            # An openslide handle stays in its error state after a failed read, also for other threads
            # reading it, so the failure may be someone else's: retry on a private fresh handle, and
            # swap a fresh one in for everybody. Only a truly bad region fails.
            part = self._retry_openslide(loc, level, size, where)
        if whole:
            if out is None:
                return np.ascontiguousarray(part), shift[0], shift[1]
            out[...] = part
            return out, shift[0], shift[1]
        dest = _white(out, w_px, h_px)  # partly outside the slide: white glass
        dest[cy0 - y_px : cy1 - y_px, cx0 - x_px : cx1 - x_px] = part
        return dest, shift[0], shift[1]

    def _read_backend(self, handle: Any, loc: _XY, level: int, size: _XY) -> np.ndarray:
        if self.backend == "openslide":
            rgba = np.asarray(handle.read_region(loc, level, size))
            return _rgba_over_white(self.colour_fix.apply(rgba[..., :3], level), rgba[..., 3])
        return self.colour_fix.apply(handle.read_region(loc, level, size, as_array=True)[..., :3], level)

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

    @renamed_keywords(size_um="side_um")
    def region_plan(self, x0_px: int, y0_px: int, side_um: float, target_mpp: float) -> RegionPlan:
        """What `read_region_um` reads for this square (level, window in level px) and how it resizes."""
        return plan_region(
            x0_px, y0_px, side_um=side_um, target_mpp=target_mpp, mpp=self.mpp,
            downsamples=self.level_downsamples, shifts_fractional_levels=self.backend == "openslide",
        )  # fmt: skip

    @renamed_keywords(size_um="side_um")
    def read_region_um(
        self, x0_px: int, y0_px: int, side_um: float, target_mpp: float, out: np.ndarray | None = None
    ) -> np.ndarray:
        """(P, P, 3) uint8 RGB of the square of `side_um` whose top-left is (x0_px, y0_px) at level 0.

        P = round(side_um / target_mpp), read from `best_level_for_mpp(target_mpp)` and copied, reduced by
        whole blocks or resized with an antialiasing filter as `plan_region` plans it; white beyond the slide.
        out: a C-contiguous (P, P, 3) uint8 array (a row of a chunk of tiles) to write the tile into,
        and return; a window that is one whole stored JPEG tile is decoded straight into it (ValueError
        for any other array). Its content is undefined after a SlideError.
        """
        plan = self.region_plan(x0_px, y0_px, side_um, target_mpp)
        if out is not None:
            check_tile_out(out, plan.tile_px)
        where = f"a {side_um:g} um region at level-0 x={x0_px} y={y0_px} (level {plan.level})"
        if plan.kind == RegionKind.COPY:
            return self._read(plan.level, *plan.window, where, out)[0]
        raw, sx, sy = self._read(plan.level, *plan.window, where)
        if plan.kind == RegionKind.REDUCE:
            tile = np.asarray(Image.fromarray(raw).reduce(plan.factor))
        else:
            bx, by, side = plan.box((sx, sy))
            tile = np.asarray(
                Image.fromarray(raw).resize(
                    (plan.tile_px, plan.tile_px), resample=plan.resample_filter((sx, sy)),
                    box=(bx, by, bx + side, by + side),
                )
            )  # fmt: skip
        if out is None:
            return tile
        out[...] = tile
        return out

    # ------------------------------------------------------------------------------------------- life
    def close(self) -> None:
        for direct in self._direct.values():
            direct.close()
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._hold is not None:
            self._hold.close()
            self._hold = None

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
    path: str | os.PathLike[str],
    *,
    backend: Backend | str = "openslide",
    mpp: float | None = None,
    direct_jpeg: bool = True,
) -> Slide:
    """Open a whole-slide image.

    path: a local file, or a URL (s3://, gs://, https://...): tiffslide reads a remote slide in place by
    byte ranges; openslide, DICOM series and MIRAX read a copy in the local cache (`wsi.storage.slides`).
    backend: "openslide" (default) or "tiffslide"; anything else raises ConfigError.
    mpp: level-0 um/px, overriding the metadata (needed for slides that carry none).
    direct_jpeg: with openslide, decode the JPEG tiles of Aperio and generic tiled TIFF levels directly
    (`wsi.slides.stored_tiles`: the same pixels, ~5x faster); False reads everything through openslide (what
    benchmarks and tests compare against). A remote slide's local copy is read so too.
    Raises SlideError (missing, empty, not a slide, truncated) or MissingMppError; StorageError for a
    remote slide that cannot be reached (missing bucket, refused credentials).
    A Slide may be shared by threads for reading (both backends read thread-safely).
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown slide backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if is_url(path):
        return _open_remote(parse_url(str(path), what="slide"), backend, mpp, direct_jpeg)
    path = Path(path)
    if not path.exists():
        raise SlideError(f"{path}: slide file not found")
    if path.is_dir():
        raise SlideError(f"{path}: is a folder, not a slide file (MIRAX .mrxs: give the .mrxs file)")
    if path.stat().st_size == 0:
        raise SlideError(f"{path}: the file is empty (0 bytes); copy or download it again")
    if is_image_slide(path):  # its pixels from its pyramid in the cache (`wsi.slides.plain_images`)
        return open_image(path, path, mpp, functools.partial(Slide, path, backend, mpp))
    # parsing the TIFF once says whether it is truncated and where its JPEG tiles lie
    jpeg = jpeg_levels(path) if is_tiff(path) else None
    return Slide(path, backend, mpp, jpeg if direct_jpeg else None)


def _open_remote(url: Url, backend: str, mpp: float | None, direct_jpeg: bool) -> Slide:
    """A remote slide: read by ranges (tiffslide) or from its local copy (openslide, multi-file formats;
    the copy's JPEG tiles are read directly, as a local slide's)."""
    file, hold = remote_slide(url, backend)  # a local copy is held from the moment it is checked
    try:
        size = file.size if isinstance(file, RangeFile) else file.stat().st_size
        if size == 0:
            raise SlideError(f"{url}: the file is empty (0 bytes); upload it again")
        if isinstance(file, Path) and is_image_slide(file):  # read from the pyramid made from the copy
            image = open_image(url, file, mpp, functools.partial(Slide, url, backend, mpp))
            if hold is not None:
                hold.close()
            return image
        if is_tiff(file):
            check_complete(file, size, url)  # names the URL, not the cache copy
        jpeg = jpeg_levels(file) if direct_jpeg and isinstance(file, Path) and is_tiff(file) else None
        return Slide(url, backend, mpp, jpeg, file=file, hold=hold)
    except BaseException:
        if hold is not None:
            hold.close()
        raise


# ----------------------------------------------------------------------------------------------- helpers
def _positive_float(value: str | float | None) -> float | None:
    if value is None:
        return None
    try:
        f = float(value)
    except ValueError:
        return None
    return f if math.isfinite(f) and f > 0 else None


def _white(out: np.ndarray | None, w_px: int, h_px: int) -> np.ndarray:
    """`out` (or a new (h, w, 3) uint8 array) filled with white glass."""
    if out is None:
        return np.full((h_px, w_px, 3), _WHITE, np.uint8)
    out.fill(_WHITE)
    return out


def _rgba_over_white(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """openslide's RGBA (un-premultiplied; transparent = no data) composited over white glass."""
    if alpha.min() == 255:
        return rgb
    a = alpha[..., None].astype(np.float32) / 255.0
    return (rgb.astype(np.float32) * a + 255.0 * (1.0 - a) + 0.5).astype(np.uint8)

"""Tile files: `tiles/<slide_id>.h5` (coordinates) and `tiles/<slide_id>.zarr` (decoded pixels).

Public API (the layout is the contract in docs/architecture.md):

    TileFile                                    # what a tile file holds (coords, coords_um, meta)
    TileFileMeta (wsi.formats.tile_meta)                # its attributes, typed
    write_tile_file(path, *, coords, coords_um, meta, candidates=None) -> None   # atomic; `complete` last
    read_tile_file(path) -> TileFile            # TileFileError if missing, incomplete or foreign
    read_tile_meta(path) -> TileFileMeta        # the same checks, without reading the coordinates
    Candidates, read_candidates(path)           # every candidate tile and the filters' verdict (review)
    coords_digest(coords) -> str                # sha256 of a tile set (bags record it: re-made on change)
    is_complete(path) -> bool                   # True only for a finished file of our format
    is_tile_file(path) -> bool                  # says it is one of ours (finished or not); never raises
    tile_file_info(path) -> dict                # the summary `wsi info` prints
    TilePixelWriter(path, *, n_max, tile_px, attrs)   # streams (k,P,P,3) uint8 batches; atomic folder
    open_tile_pixels(path) -> zarr.Array        # (N,P,P,3) uint8, one chunk per tile; TileFileError
    pixels_complete(path, n=None) -> bool

Both files are written under a temporary name and renamed into place, and carry a `complete`
attribute set as the last step, so a half-written or foreign file is never trusted by a re-run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import h5py
import numpy as np

from wsi.core.errors import ConfigError, TileFileError
from wsi.core.files import atomic_path, replace_path, temp_sibling
from wsi.core.json_types import JsonObject
from wsi.core.suffixes import TILE_PIXELS_SUFFIX
from wsi.formats.hdf5 import attrs_of, outside_reason, plain, storage_problem
from wsi.formats.tile_meta import TileFileMeta

if TYPE_CHECKING:  # zarr (0.2-0.4 s to import) only where tile pixels are written or read
    import zarr

FORMAT = "wsi-tiles"
FORMAT_VERSION = 1
PIXELS_FORMAT = "wsi-tile-pixels"


@dataclass
class TileFile:
    """The contents of one `tiles/<slide_id>.h5`."""

    path: Path
    coords: np.ndarray  # (N, 2) int64, top-left in level-0 pixels
    coords_um: np.ndarray  # (N, 2) float32, top-left in micrometres
    meta: TileFileMeta  # every attribute, typed

    @property
    def slide_id(self) -> str:
        return self.meta.slide_id

    @property
    def slide_path(self) -> str:
        return self.meta.slide_path

    @property
    def tile_um(self) -> float:
        return self.meta.tile_um

    @property
    def tile_px(self) -> int:
        return self.meta.tile_px

    @property
    def mpp(self) -> float:
        return self.meta.mpp

    @property
    def target_mpp(self) -> float:
        return self.meta.target_mpp

    @property
    def params(self) -> JsonObject:
        return dict(self.meta.params)

    def __len__(self) -> int:
        return len(self.coords)


@dataclass
class Candidates:
    """Every candidate tile of a slide (a grid cell with enough tissue, inside any --roi) and the filters'
    verdict on it: what `wsi tile --review` re-decides without reading the slide again. Datasets
    `candidate_coords`, `candidate_coords_um`, `candidate_reasons` (attributes `names`, `empty_reason`)."""

    coords: np.ndarray  # (M, 2) int64 level-0 top-left, grid order
    coords_um: np.ndarray  # (M, 2) float32 top-left in micrometres
    reasons: np.ndarray  # (M,) int8 the filters' reason codes (before any review)
    names: dict[int, str]  # reason code -> name, for every code the run could give (model classes too)
    empty_reason: str = ""  # why the filters kept no tile ("" when they kept some)
    #: (M,) uint8 the marker colour of each tile rejected as ink (0 elsewhere; dataset
    #: `candidate_ink_colours`, its attribute `names`: code -> colour), or None when not recorded
    ink_colours: np.ndarray | None = None
    colour_names: dict[int, str] = field(default_factory=dict)


def coords_digest(coords: np.ndarray) -> str:
    """sha256 of a tile set: (N, 2) level-0 coordinates as little-endian int64, in order."""
    data = np.ascontiguousarray(np.asarray(coords).reshape(-1, 2), dtype="<i8")
    return hashlib.sha256(data.tobytes()).hexdigest()


def write_tile_file(
    path: str | os.PathLike[str],
    *,
    coords: np.ndarray,
    coords_um: np.ndarray,
    meta: TileFileMeta,
    candidates: Candidates | None = None,
) -> None:
    """Write a tile file atomically, `meta` as its root attributes (`complete` set last)."""
    coords = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
    coords_um = np.asarray(coords_um, dtype=np.float32).reshape(-1, 2)
    if len(coords) != len(coords_um):
        raise ValueError(f"coords ({len(coords)}) and coords_um ({len(coords_um)}) differ in length")
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as h5:
        h5.create_dataset("coords", data=coords)
        h5.create_dataset("coords_um", data=coords_um)
        if candidates is not None:
            _write_candidates(h5, candidates)
        for name, value in meta.to_attrs().items():
            h5.attrs[name] = value
        h5.attrs["format"] = FORMAT
        h5.attrs["format_version"] = FORMAT_VERSION
        h5.attrs["complete"] = True  # last: a file without it was cut short


def _check(h5: h5py.File, path: Path) -> TileFileMeta:
    try:  # links out of the file, external or virtual storage, soft-link loops (wsi.formats.hdf5)
        reason = outside_reason(h5)
    except (RuntimeError, KeyError, ValueError) as exc:
        reason = f"its links cannot be walked ({exc})"
    if reason:
        raise TileFileError(f"{path} is refused: {reason}; re-run `wsi tile --overwrite`")
    fmt = plain(h5.attrs.get("format"))
    if fmt != FORMAT:
        raise TileFileError(f"{path} is not a wsi tile file (format={fmt!r}); re-run `wsi tile`")
    version = plain(h5.attrs.get("format_version"))
    if version != FORMAT_VERSION:
        raise TileFileError(
            f"{path} has tile-file format version {version}, this wsi reads {FORMAT_VERSION}; "
            "re-run `wsi tile --overwrite`"
        )
    if not bool(plain(h5.attrs.get("complete", False))):
        raise TileFileError(f"{path} is incomplete (interrupted write); re-run `wsi tile`")
    try:
        meta = TileFileMeta.from_attrs(attrs_of(h5), source=str(path))
    except ConfigError as exc:
        raise TileFileError(f"{exc}; re-run `wsi tile --overwrite`") from None
    if "coords" not in h5 or "coords_um" not in h5:
        raise TileFileError(f"{path} lacks coords; re-run `wsi tile --overwrite`")
    n = h5["coords"].shape[0]
    if h5["coords"].shape != (n, 2) or h5["coords_um"].shape != (n, 2) or n != meta.n_kept:
        raise TileFileError(f"{path} has inconsistent coords / n_kept; re-run `wsi tile --overwrite`")
    for name in ("coords", "coords_um"):
        problem = storage_problem(h5[name], path.stat().st_size)
        if problem:
            raise TileFileError(f"{path}: `{name}` {problem}; re-run `wsi tile --overwrite`")
    return meta


def read_tile_file(path: str | os.PathLike[str]) -> TileFile:
    """Read and validate a tile file."""
    path = Path(path)
    if not path.is_file():
        raise TileFileError(f"tile file {path} not found; run `wsi tile` first")
    try:
        with h5py.File(path, "r") as h5:
            meta = _check(h5, path)
            coords = h5["coords"][()].astype(np.int64)
            coords_um = h5["coords_um"][()].astype(np.float32)
    except OSError as exc:
        raise TileFileError(f"{path} is not a readable HDF5 file ({exc}); re-run `wsi tile`") from exc
    return TileFile(path=path, coords=coords, coords_um=coords_um, meta=meta)


def read_tile_meta(path: str | os.PathLike[str]) -> TileFileMeta:
    """A tile file's attributes, checked as `read_tile_file` checks the file, without reading its
    coordinates: cheap on thousands of files (`wsi info FOLDER`)."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as h5:
            return _check(h5, path)
    except OSError as exc:
        raise TileFileError(f"{path} is not a readable HDF5 file ({exc}); re-run `wsi tile`") from exc


def _write_candidates(h5: h5py.File, c: Candidates) -> None:
    m = len(c.reasons)
    if np.shape(c.coords) != (m, 2) or np.shape(c.coords_um) != (m, 2):
        raise ValueError(f"candidates disagree: {np.shape(c.coords)}, {np.shape(c.coords_um)}, {m} reasons")
    h5.create_dataset("candidate_coords", data=np.asarray(c.coords, dtype=np.int64))
    h5.create_dataset("candidate_coords_um", data=np.asarray(c.coords_um, dtype=np.float32))
    ds = h5.create_dataset("candidate_reasons", data=np.asarray(c.reasons, dtype=np.int8))
    ds.attrs["names"] = json.dumps({str(k): v for k, v in sorted(c.names.items())})
    ds.attrs["empty_reason"] = c.empty_reason
    if c.ink_colours is not None:
        if np.shape(c.ink_colours) != (m,):
            raise ValueError(f"candidates disagree: {np.shape(c.ink_colours)} ink colours for {m} reasons")
        ink = h5.create_dataset("candidate_ink_colours", data=np.asarray(c.ink_colours, dtype=np.uint8))
        ink.attrs["names"] = json.dumps({str(k): v for k, v in sorted(c.colour_names.items())})


def read_candidates(path: str | os.PathLike[str]) -> Candidates | None:
    """The candidates a finished tile file stores; None when it predates them (TileFileError: damaged)."""
    path = Path(path)
    read_tile_file(path)  # finished, ours, and only itself
    names = ("candidate_coords", "candidate_coords_um", "candidate_reasons")
    try:
        with h5py.File(path, "r") as h5:
            if not all(isinstance(h5.get(n), h5py.Dataset) for n in names):
                return None
            m = h5["candidate_reasons"].shape[0] if h5["candidate_reasons"].ndim == 1 else -1
            shapes = [h5[n].shape for n in names]
            if m < 0 or shapes != [(m, 2), (m, 2), (m,)]:
                raise TileFileError(f"{path}: candidates of shapes {shapes}; re-run `wsi tile --overwrite`")
            for n in names:
                problem = storage_problem(h5[n], path.stat().st_size)
                if problem:
                    raise TileFileError(f"{path}: `{n}` {problem}; re-run `wsi tile --overwrite`")
            ds = h5["candidate_reasons"]
            table = json.loads(str(plain(ds.attrs.get("names", "{}"))))
            colours, colour_names = None, {}
            ink = h5.get("candidate_ink_colours")
            if isinstance(ink, h5py.Dataset) and ink.shape == (m,):
                colours = ink[()].astype(np.uint8)
                colour_names = json.loads(str(plain(ink.attrs.get("names", "{}"))))
            return Candidates(
                coords=h5["candidate_coords"][()].astype(np.int64),
                coords_um=h5["candidate_coords_um"][()].astype(np.float32),
                reasons=ds[()].astype(np.int8),
                names={int(k): str(v) for k, v in table.items()},
                empty_reason=str(plain(ds.attrs.get("empty_reason", ""))),
                ink_colours=colours,
                colour_names={int(k): str(v) for k, v in colour_names.items()},
            )
    except (OSError, ValueError, KeyError) as exc:  # json.JSONDecodeError is a ValueError
        raise TileFileError(f"{path}: unreadable candidates ({exc}); re-run `wsi tile --overwrite`") from None


def is_complete(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a finished tile file of this format (never raises)."""
    path = Path(path)
    if not path.is_file():
        return False
    try:
        with h5py.File(path, "r") as h5:
            _check(h5, path)
    except (OSError, TileFileError, KeyError, ValueError):
        return False
    return True


def is_tile_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is an HDF5 file that says it is a wsi tile file (finished or not; `read_tile_file`
    says what is wrong with it). False for anything else, never raises: tells tile files from bags."""
    try:
        with h5py.File(path, "r") as h5:
            return bool(plain(h5.attrs.get("format")) == FORMAT)
    except OSError:
        return False


#: tile-file attributes `wsi info` shows first, in this order; every count the file stores follows
_INFO_KEYS = ("slide_id", "slide_path", "tile_size_um", "tile_size_px", "mpp", "target_mpp", "backend",
              "vendor", "n_grid", "n_tissue", "n_kept")  # fmt: skip


def tile_file_info(path: str | os.PathLike[str]) -> JsonObject:
    """An ordered summary of one tile file, as `wsi info` prints it (TileFileError if unreadable)."""
    path = Path(path)
    tf = read_tile_file(path)
    m = tf.meta.to_attrs()
    out: JsonObject = {"file": str(path), "kind": f"tile file ({FORMAT})", "tiles": len(tf)}
    for key in _INFO_KEYS:
        if key in m:
            out[key] = m[key]
    # every other count, as stored (the fates of TileCounts, then ROI, review, damage, segmentation):
    # what a user asks first is where the tiles that were not kept went
    out.update({k: v for k, v in m.items() if k.startswith("n_") and k not in out})
    for key in ("artifact_counts", "review_path", "roi_path", "wsi_version"):
        if key in m:
            out[key] = m[key]
    out["level0_size_px"] = f"{m.get('level0_width')} x {m.get('level0_height')}"
    if len(tf):
        lo, hi = tf.coords_um.min(axis=0), tf.coords_um.max(axis=0) + tf.tile_um
        out["extent_um"] = f"x {lo[0]:.0f}-{hi[0]:.0f}, y {lo[1]:.0f}-{hi[1]:.0f}"
    cache = path.with_suffix(TILE_PIXELS_SUFFIX)
    out["pixel_cache"] = str(cache) if cache.is_dir() else "none"
    return out


class PixelStoreAttrs(TypedDict, total=False):
    """What a tile-pixel store records about its tiles (besides `format`, `n_tiles`, `complete`)."""

    slide_id: str
    tile_size_um: float  # the stored names, as in the tile file
    tile_size_px: int
    target_mpp: float
    params: str  # the TileParams as sorted-key JSON, as in the tile file


class TilePixelWriter:
    """Stream kept tiles into `tiles/<slide_id>.zarr`: (N, P, P, 3) uint8, one compressed chunk per tile.

    Written into a temporary folder; `close()` marks it complete and renames it into place; an
    exception inside the `with` block removes the temporary folder and leaves any old output as it was.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, n_max: int, tile_px: int, attrs: PixelStoreAttrs | None = None
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = temp_sibling(self.path)
        self._n = 0
        # zarr keeps attributes as JSON: the round trip refuses what JSON cannot hold before any pixel is
        # written, and gives the JSON-typed mapping zarr takes
        self._attrs: JsonObject = json.loads(json.dumps(attrs or {}))
        import zarr
        from zarr.codecs import BloscCodec

        self._array = zarr.create_array(
            store=str(self._tmp),
            shape=(max(n_max, 0), tile_px, tile_px, 3),
            chunks=(1, tile_px, tile_px, 3),
            dtype="uint8",
            compressors=BloscCodec(cname="zstd", clevel=1, shuffle="noshuffle"),
            fill_value=0,
            dimension_names=("tile", "y", "x", "channel"),
        )

    def append(self, tiles: np.ndarray) -> None:
        """Add a batch (k, P, P, 3) uint8 of kept tiles, in the order of the tile file's coords."""
        k = len(tiles)
        if k == 0:
            return
        if self._n + k > self._array.shape[0]:
            raise ValueError(f"more tiles than n_max={self._array.shape[0]}")
        self._array[self._n : self._n + k] = tiles
        self._n += k

    def close(self) -> None:
        self._array.resize((self._n, *self._array.shape[1:]))
        self._array.attrs.update({**self._attrs, "format": PIXELS_FORMAT, "n_tiles": self._n})
        self._array.attrs["complete"] = True
        replace_path(self._tmp, self.path)

    def abort(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> TilePixelWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def open_tile_pixels(path: str | os.PathLike[str]) -> zarr.Array:
    """Open a finished tile-pixel store read-only: (N, P, P, 3) uint8 in tile-file order."""
    path = Path(path)
    if not path.is_dir():
        raise TileFileError(f"tile pixels {path} not found; run `wsi tile --save-tiles`")
    import zarr

    try:
        array = zarr.open_array(store=str(path), mode="r")
    except Exception as exc:  # zarr raises several types for a foreign/broken folder
        raise TileFileError(f"{path} is not a readable zarr array ({exc}); re-run `wsi tile`") from exc
    attrs = dict(array.attrs)
    if attrs.get("format") != PIXELS_FORMAT or not attrs.get("complete"):
        raise TileFileError(f"{path} is incomplete or not a wsi tile-pixel store; re-run `wsi tile`")
    if array.ndim != 4 or array.shape[3] != 3 or array.dtype != np.uint8:
        raise TileFileError(f"{path} has shape {array.shape} {array.dtype}, expected (N, P, P, 3) uint8")
    return array


def pixels_complete(path: str | os.PathLike[str], n: int | None = None) -> bool:
    """Whether `path` is a finished tile-pixel store (with `n` tiles when given); never raises."""
    try:
        array = open_tile_pixels(path)
    except TileFileError:
        return False
    return n is None or array.shape[0] == n

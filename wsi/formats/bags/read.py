"""Reading and sniffing bags: ours and the layouts of STAMP, CLAM and TRIDENT, into one `Bag`.

Layouts, told apart by `bag_layout`:
  wsi      ours: `format` = "wsi-bag" (see write.py), coords in um, provenance attributes
  stamp    `feats`, coords in um, `tile_size_um` (KatherLab/STAMP >= 2)
  clam     `features`, level-0 px coords with `patch_size` / `patch_level` (/ `downsample`) on `coords`
  trident  `features`, level-0 px coords with `patch_size_level0` on `coords`
CLAM and TRIDENT coordinates are placed in micrometres with the slide's level-0 mpp (geometry.py);
without one, and with `require_um=False`, they stay in pixels (`coords_um` None).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from wsi.core.errors import BagFormatError, ConfigError, WsiError
from wsi.core.json_types import JsonObject
from wsi.core.renamed import renamed
from wsi.formats.bags.format import FORMAT, BagProvenance
from wsi.formats.bags.geometry import Placement, place_pixel_layout, place_um_layout
from wsi.formats.bags.safe import check_fits, coords_dataset, feature_dataset, native, open_bag_file
from wsi.formats.hdf5 import attrs_of, plain

log = logging.getLogger(__name__)

Rows = slice | np.ndarray | list[int] | None


@dataclass
class Bag:
    """One slide's features with top-left tile coordinates in micrometres.

    `coords_um` is None only for a pixel-layout bag (CLAM, TRIDENT) whose resolution is unknown, loaded
    with `require_um=False`; its positions are then `coords_px` with tiles `tile_px0` px wide.
    """

    feats: np.ndarray  # (N, D)
    coords_um: np.ndarray | None  # (N, 2) float32, top-left x, y in micrometres
    tile_um: float | None
    meta: JsonObject  # every attribute of the file (and of `coords`), plus "layout"
    path: Path
    slide_id: str
    coords_px: np.ndarray | None = field(default=None)  # (N, 2) int64 level-0 px, when the file has them
    provenance: BagProvenance | None = None  # ours: how the features were made; other layouts: None
    mpp: float | None = None  # the slide's level-0 um/px, when known
    mpp_source: str = ""  # where `mpp` came from: "given", "bag attribute mpp", "TRIDENT ... (nominal)"
    tile_px0: float | None = None  # tile side in level-0 px (pixel layouts), when known

    def __len__(self) -> int:
        return int(self.feats.shape[0])

    @property
    def dim(self) -> int:
        return int(self.feats.shape[1])


@dataclass(frozen=True)
class BagHeader:
    """What a bag holds, read without its arrays (cheap on thousands of bags)."""

    path: Path
    layout: str  # wsi | stamp | clam | trident
    n_tiles: int
    dim: int  # feature width D
    dtype: str  # of the stored features: float16, float32, ...
    attrs: JsonObject  # root attributes (of any layout: free-form)


def _layout(h5: h5py.File, path: Path) -> str:
    if plain(h5.attrs.get("format")) == FORMAT:
        return "wsi"
    if "coords" not in h5:
        raise BagFormatError(f"{path} has no `coords` dataset; it is not a feature bag this tool can read")
    coord_attrs = {**attrs_of(h5), **attrs_of(h5["coords"])}
    if "features" in h5 and "feats" not in h5:
        if "patch_size_level0" in coord_attrs:
            return "trident"
        return "clam"
    if "feats" in h5:
        return "stamp"
    raise BagFormatError(f"{path} has neither a `feats` nor a `features` dataset; it is not a feature bag")


def bag_layout(path: str | os.PathLike[str]) -> str:
    """The layout: "wsi", "stamp", "clam" or "trident"; BagFormatError for anything else."""
    path = Path(path)
    with open_bag_file(path) as h5:
        return _layout(h5, path)


def read_bag_header(path: str | os.PathLike[str], *, attr_names: tuple[str, ...] | None = None) -> BagHeader:
    """Layout, tile count, feature width and dtype, and root attributes of a bag of any layout: all of
    them, or only `attr_names` (those present; a bag of ours holds ~20, and reading them is most of the
    time this takes: `wsi info FOLDER` over thousands of bags asks for two)."""
    path = Path(path)
    with open_bag_file(path) as h5:
        layout = _layout(h5, path)
        ds = feature_dataset(h5, path)
        dtype = ds.dtype.newbyteorder("=").name
        if attr_names is None:
            attrs = attrs_of(h5)
        else:
            attrs = {k: plain(h5.attrs[k]) for k in attr_names if k in h5.attrs}
        if ds.shape == (0,):  # TRIDENT's empty slide: no tiles, and no width either
            return BagHeader(path, layout, 0, 0, dtype, attrs)
        return BagHeader(path, layout, int(ds.shape[0]), int(ds.shape[1]), dtype, attrs)


def bag_length(path: str | os.PathLike[str]) -> int:
    """Number of tiles, from the dataset shape alone (cheap on thousands of bags)."""
    path = Path(path)
    with open_bag_file(path) as h5:
        return int(feature_dataset(h5, path).shape[0])


def read_bag_attrs(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Root attributes of a bag (ours: the provenance, see `BagProvenance`), as plain Python.

    Untyped on purpose, for now: predict's top tiles and heatmaps read our bags' `tile_size_um`, `mpp`
    and `slide_path` from it by key. Typed readers: `read_bag(...).provenance`, `read_bag_header`."""
    path = Path(path)
    with open_bag_file(path) as h5:
        return attrs_of(h5)


def is_complete_bag(path: str | os.PathLike[str], *, encoder: str, weights_sha256: str) -> bool:
    """Whether a re-run may skip `path`: one of ours, readable, from the same encoder and weights."""
    path = Path(path)
    try:
        with open_bag_file(path) as h5:
            attrs = attrs_of(h5)
            n = int(feature_dataset(h5, path).shape[0])
            coords_dataset(h5, path, "coords", n)
            return (
                attrs.get("format") == FORMAT
                and attrs.get("encoder") == encoder
                and attrs.get("weights_sha256") == weights_sha256
                and attrs.get("n_tiles", n) == n
            )
    except WsiError:
        return False


def _read_rows(ds: h5py.Dataset, rows: Rows) -> np.ndarray:
    if rows is None:
        return native(ds[()])
    if isinstance(rows, slice):
        return native(ds[rows])
    idx = np.asarray(rows, dtype=np.int64)
    if idx.size and (idx.min() < -ds.shape[0] or idx.max() >= ds.shape[0]):
        raise IndexError(f"rows out of range for a bag of {ds.shape[0]} tiles")
    idx = np.where(idx < 0, idx + ds.shape[0], idx)
    # h5py fancy indexing wants unique increasing indices: read those, then restore the asked order.
    uniq, inverse = np.unique(idx, return_inverse=True)
    return native(ds[uniq][inverse] if uniq.size else ds[:0])


def _provenance(root: JsonObject, path: Path) -> BagProvenance | None:
    try:
        return BagProvenance.from_dict(root, source=str(path))
    except ConfigError as exc:  # the features still load; what made them is not fully known
        log.warning("%s: incomplete provenance attributes (%s)", path, exc)
        return None


def read_bag(
    path: str | os.PathLike[str], *, mpp: float | None = None, rows: Rows = None, require_um: bool = True
) -> Bag:
    """Read a bag of any supported layout into features and top-left coordinates in micrometres.

    mpp: the slide's level-0 um/px for CLAM/TRIDENT bags (wins over their attributes; ignored by
    layouts that store micrometres). rows: int indices or a slice to read only those tiles (e.g. a
    random sample for training), in that order. require_um=False: a pixel-layout bag whose resolution
    is unknown loads with `coords_um` None instead of raising (for models that use no tile positions).
    """
    return _load(Path(path), mpp=mpp, rows=rows, require_um=require_um, with_feats=True)


load_bag = renamed(read_bag, "wsi.formats.bags.load_bag")  # the old name, for callers' code


@dataclass
class BagStream:
    """A bag too large to hold whole: positions and attributes in memory, features read in row chunks.

    `bag` is the bag without its features (`bag.feats` has shape (N, 0)); `chunks(size)` reads
    features (n, D) as stored, `size` rows at a time, so a million-tile bag (4 GB of float16) never
    sits in memory at once.
    """

    bag: Bag
    n_tiles: int
    dim: int

    def chunks(self, size: int) -> Iterator[np.ndarray]:
        """Feature rows in order, `size` at a time. Each chunk is a view of ONE buffer that the next
        chunk overwrites (no allocation per chunk): use or copy it before asking for the next."""
        if size < 1:
            raise ValueError(f"chunk size must be at least 1, got {size}")
        with open_bag_file(self.bag.path) as h5:
            ds = feature_dataset(h5, self.bag.path)
            if ds.shape != (self.n_tiles, self.dim):
                raise BagFormatError(f"{self.bag.path} changed while it was read; re-run on the final file")
            dtype = ds.dtype.newbyteorder("=")  # read_direct converts a big-endian bag's values
            check_fits(
                self.bag.path, min(size, self.n_tiles) * self.dim * dtype.itemsize, "a chunk of features"
            )
            buf = np.empty((min(size, self.n_tiles), self.dim), dtype=dtype)
            for start in range(0, self.n_tiles, size):
                rows = min(size, self.n_tiles - start)
                ds.read_direct(buf, np.s_[start : start + rows], np.s_[:rows])
                yield buf[:rows]


def open_bag_stream(
    path: str | os.PathLike[str], *, mpp: float | None = None, require_um: bool = True
) -> BagStream:
    """A bag's positions now and its features later, chunk by chunk (see `BagStream`); the same
    layouts, units and errors as `read_bag`."""
    bag = _load(Path(path), mpp=mpp, rows=None, require_um=require_um, with_feats=False)
    header = read_bag_header(path)
    return BagStream(bag=bag, n_tiles=header.n_tiles, dim=header.dim)


def _load(path: Path, *, mpp: float | None, rows: Rows, require_um: bool, with_feats: bool) -> Bag:
    with open_bag_file(path) as h5:
        layout = _layout(h5, path)
        feats_ds = feature_dataset(h5, path)
        if feats_ds.shape[:1] == (0,):  # TRIDENT writes (0,) or (0, D) for a slide without tissue
            raise BagFormatError(f"{path} holds no tiles: an empty slide, nothing to learn or predict from")
        n, dim = feats_ds.shape
        coords_ds = coords_dataset(h5, path, "coords", n)
        n_read = n if rows is None else len(range(n)[rows]) if isinstance(rows, slice) else len(rows)
        row_bytes = dim * feats_ds.dtype.itemsize if with_feats else 0
        what = f"reading {n_read} tiles x {dim} {feats_ds.dtype.newbyteorder('=').name} features"
        check_fits(path, n_read * row_bytes + n * 32, what if with_feats else f"reading {n} tile positions")
        root = attrs_of(h5)
        attrs = {**root, **attrs_of(coords_ds)}  # CLAM/TRIDENT keep patch attributes on `coords`
        coords = _read_rows(coords_ds, rows)
        if not np.isfinite(coords).all():
            raise BagFormatError(
                f"{path}: tile positions (`coords`) hold NaN or infinite values; re-create it"
            )
        # positions only: BagStream reads the features later
        feats = (
            _read_rows(feats_ds, rows)
            if with_feats
            else np.empty((len(coords), 0), feats_ds.dtype.newbyteorder("="))
        )
        coords_px: np.ndarray | None = None
        if layout == "wsi" and "coords_px" in h5:
            coords_px = _read_rows(coords_dataset(h5, path, "coords_px", n), rows)
            if not np.isfinite(coords_px).all():
                raise BagFormatError(f"{path}: `coords_px` holds NaN or infinite values; re-create it")
            coords_px = coords_px.astype(np.int64)

        def all_coords() -> np.ndarray:  # the whole grid, for a tile size inferred from it
            return np.asarray(coords_ds[()]) if rows is not None else np.asarray(coords)

        place: Placement
        if layout in ("wsi", "stamp"):
            place = place_um_layout(layout, coords, attrs, path, all_coords)
        else:
            coords_px = np.asarray(coords).astype(np.int64)
            place = place_pixel_layout(
                layout, coords, attrs, path, all_coords, mpp=mpp, require_um=require_um
            )
            if place.mpp is not None:
                attrs["mpp"] = place.mpp
    return Bag(
        feats=np.asarray(feats),
        coords_um=place.coords_um,
        tile_um=place.tile_um,
        meta={**attrs, "layout": layout},
        path=path,
        slide_id=str(root.get("slide_id") or path.stem),
        coords_px=coords_px,
        provenance=_provenance(root, path) if layout == "wsi" else None,
        mpp=place.mpp,
        mpp_source=place.mpp_source,
        tile_px0=place.tile_px0,
    )

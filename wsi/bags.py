"""Feature bags: write ours, read ours and the layouts of STAMP, CLAM and TRIDENT into one `Bag`.

Bags from different tools disagree on names (`feats` vs `features`) and units (micrometres vs level-0
pixels). Everything downstream (training, prediction, heatmaps) reads bags only through `load_bag`, so
it sees one shape: features (N, D) and top-left coordinates in micrometres.

Public API:
  Bag                                    in-memory bag: feats (N,D), coords_um (N,2) float32, tile_size_um,
                                         meta (dict of file attributes + "layout"), path, slide_id,
                                         coords_px (N,2) int64 | None; len(bag) == N, bag.dim == D
  load_bag(path, *, mpp=None, rows=None) -> Bag
        ours ("wsi-bag"), STAMP (`feats`, coords in um, `tile_size_um`), CLAM (`features`, level-0 px
        coords with `patch_size`/`patch_level`), TRIDENT (`features`, coords with `patch_size_level0`).
        CLAM and TRIDENT coords need the slide's level-0 `mpp` (argument, or an `mpp` attribute).
        `rows` (int indices or a slice) reads only those tiles, e.g. a random sample for training.
  bag_length(path) -> int                number of tiles, read from the dataset shape (no data loaded)
  bag_layout(path) -> str                "wsi" | "stamp" | "clam" | "trident"
  read_bag_attrs(path) -> dict           root attributes of a bag (ours: encoder, weights_sha256, ...)
  is_complete_bag(path, *, encoder, weights_sha256) -> bool
                                         True for a readable bag of ours made by that encoder + weights
  write_bag(path, *, feats, coords_um, coords_px, encoder, weights_sha256, tile_size_um, tile_size_px,
            mpp, level0_width, level0_height, tile_params, slide_id, dtype="float16", extra_attrs=None)
                                         writes the `wsi-bag` layout atomically (see docs/architecture.md)
Errors: `BagFormatError` naming the file and the missing dataset or attribute.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from wsi._h5 import attrs_of, plain
from wsi.errors import BagFormatError
from wsi.files import atomic_path

FORMAT = "wsi-bag"
FORMAT_VERSION = 1
LAYOUTS = ("wsi", "stamp", "clam", "trident")

Rows = slice | np.ndarray | list[int] | None


@dataclass
class Bag:
    """One slide's features with top-left tile coordinates in micrometres."""

    feats: np.ndarray  # (N, D)
    coords_um: np.ndarray  # (N, 2) float32, top-left x, y in micrometres
    tile_size_um: float | None
    meta: dict[str, Any]
    path: Path
    slide_id: str
    coords_px: np.ndarray | None = field(default=None)  # (N, 2) int64 level-0 px, when the file has them

    def __len__(self) -> int:
        return int(self.feats.shape[0])

    @property
    def dim(self) -> int:
        return int(self.feats.shape[1])


# ---------------------------------------------------------------------------------------------- writing


def write_bag(
    path: str | os.PathLike[str],
    *,
    feats: np.ndarray,
    coords_um: np.ndarray,
    coords_px: np.ndarray,
    encoder: str,
    weights_sha256: str,
    tile_size_um: float,
    tile_size_px: int,
    mpp: float,
    level0_width: int,
    level0_height: int,
    tile_params: dict[str, Any] | str,
    slide_id: str,
    dtype: str = "float16",
    extra_attrs: dict[str, Any] | None = None,
) -> Path:
    """Write a bag in our layout; the file appears only when complete (temp file + rename)."""
    from wsi import __version__

    if dtype not in ("float16", "float32"):
        raise BagFormatError(f"bag dtype {dtype!r} is not supported; use float16 or float32")
    feats = np.asarray(feats)
    n = feats.shape[0]
    if feats.ndim != 2 or np.shape(coords_um) != (n, 2) or np.shape(coords_px) != (n, 2):
        raise ValueError(
            f"bag arrays disagree: feats {feats.shape}, coords_um {np.shape(coords_um)}, "
            f"coords_px {np.shape(coords_px)}"
        )
    with np.errstate(over="ignore"):  # overflow is detected just below, with a useful message
        feats_out = feats.astype(dtype)
    if not np.isfinite(feats_out).all():
        raise BagFormatError(
            f"features for {slide_id} do not fit {dtype} (values beyond its range); use --dtype float32"
        )
    attrs: dict[str, Any] = {
        "slide_id": slide_id,
        "encoder": encoder,
        "weights_sha256": weights_sha256,
        "tile_size_um": float(tile_size_um),
        "tile_size_px": int(tile_size_px),
        "unit": "um",
        "mpp": float(mpp),
        "level0_width": int(level0_width),
        "level0_height": int(level0_height),
        "wsi_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "tile_params": tile_params if isinstance(tile_params, str) else json.dumps(tile_params),
        "n_tiles": int(n),
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
    }
    attrs.update(extra_attrs or {})
    final = Path(path)
    with atomic_path(final) as tmp, h5py.File(tmp, "w") as h5:
        h5.create_dataset("feats", data=feats_out, chunks=(min(max(n, 1), 1024), feats.shape[1]))
        h5.create_dataset("coords", data=np.asarray(coords_um, dtype=np.float32))
        h5.create_dataset("coords_px", data=np.asarray(coords_px, dtype=np.int64))
        h5["features"] = h5py.SoftLink("/feats")  # CLAM / TRIDENT readers look for `features`
        for key, value in attrs.items():
            h5.attrs[key] = value
    return final


# ---------------------------------------------------------------------------------------------- reading


def _open(path: Path) -> h5py.File:
    if not path.is_file():
        raise BagFormatError(f"bag {path} does not exist")
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise BagFormatError(f"{path} is not a readable HDF5 bag ({exc}); re-create it") from None




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
    path = Path(path)
    with _open(path) as h5:
        return _layout(h5, path)


def _feats_ds(h5: h5py.File, path: Path) -> h5py.Dataset:
    for name in ("feats", "features"):
        if name in h5:
            return h5[name]
    raise BagFormatError(f"{path} has neither a `feats` nor a `features` dataset")


def bag_length(path: str | os.PathLike[str]) -> int:
    """Number of tiles, from the dataset shape alone (cheap on thousands of bags)."""
    path = Path(path)
    with _open(path) as h5:
        return int(_feats_ds(h5, path).shape[0])


def read_bag_attrs(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    with _open(path) as h5:
        return attrs_of(h5)


def is_complete_bag(path: str | os.PathLike[str], *, encoder: str, weights_sha256: str) -> bool:
    """Whether a re-run may skip `path`: one of ours, readable, from the same encoder and weights."""
    try:
        with h5py.File(path, "r") as h5:
            attrs = attrs_of(h5)
            n = int(h5["feats"].shape[0])
            return (
                attrs.get("format") == FORMAT
                and attrs.get("encoder") == encoder
                and attrs.get("weights_sha256") == weights_sha256
                and h5["coords"].shape == (n, 2)
                and attrs.get("n_tiles", n) == n
            )
    except (OSError, KeyError):
        return False


def _read_rows(ds: h5py.Dataset, rows: Rows) -> np.ndarray:
    if rows is None:
        return ds[()]
    if isinstance(rows, slice):
        return ds[rows]
    idx = np.asarray(rows, dtype=np.int64)
    if idx.size and (idx.min() < -ds.shape[0] or idx.max() >= ds.shape[0]):
        raise IndexError(f"rows out of range for a bag of {ds.shape[0]} tiles")
    idx = np.where(idx < 0, idx + ds.shape[0], idx)
    # h5py fancy indexing wants unique increasing indices: read those, then restore the asked order.
    uniq, inverse = np.unique(idx, return_inverse=True)
    return ds[uniq][inverse] if uniq.size else ds[:0]


def _need(attrs: dict[str, Any], name: str, path: Path, layout: str, hint: str = "") -> Any:
    if name not in attrs or attrs[name] is None:
        raise BagFormatError(
            f"{path} ({layout} layout) lacks the `{name}` attribute needed to place its tiles{hint}"
        )
    return attrs[name]


def _mpp_for(mpp: float | None, attrs: dict[str, Any], path: Path, layout: str) -> float:
    if mpp is not None:
        return float(mpp)
    if attrs.get("mpp") is not None:
        return float(attrs["mpp"])
    raise BagFormatError(
        f"{path} ({layout} layout) stores coordinates in level-0 pixels and no `mpp` attribute; "
        "give the slide's level-0 resolution (load_bag(path, mpp=...), or an mpp column / --mpp)"
    )


def load_bag(path: str | os.PathLike[str], *, mpp: float | None = None, rows: Rows = None) -> Bag:
    """Read a bag of any supported layout into features and top-left coordinates in micrometres."""
    path = Path(path)
    with _open(path) as h5:
        layout = _layout(h5, path)
        feats_ds = _feats_ds(h5, path)
        coords_ds = h5["coords"]
        if feats_ds.ndim != 2 or coords_ds.ndim != 2 or coords_ds.shape != (feats_ds.shape[0], 2):
            raise BagFormatError(
                f"{path}: features {feats_ds.shape} and coords {coords_ds.shape} do not match; "
                "expected (N, D) and (N, 2)"
            )
        root = attrs_of(h5)
        attrs = {**root, **attrs_of(coords_ds)}  # CLAM/TRIDENT keep patch attributes on `coords`
        feats = _read_rows(feats_ds, rows)
        coords = _read_rows(coords_ds, rows)
        coords_px: np.ndarray | None = None

        if layout == "wsi":
            tile_size_um = float(_need(attrs, "tile_size_um", path, layout))
            coords_um = coords.astype(np.float32)
            if "coords_px" in h5:
                coords_px = _read_rows(h5["coords_px"], rows).astype(np.int64)
        elif layout == "stamp":
            unit = attrs.get("unit", "um")
            if unit not in ("um", "micron", "microns"):
                raise BagFormatError(f"{path} (stamp layout) has coords in unit {unit!r}; only um is known")
            tile_size_um = float(
                _need(attrs, "tile_size_um", path, layout, " (older STAMP bags: re-extract with STAMP>=2)")
            )
            coords_um = coords.astype(np.float32)
        else:
            coords_px = np.asarray(coords).astype(np.int64)
            level0_mpp = _mpp_for(mpp, attrs, path, layout)
            if layout == "trident":
                size_px0 = float(_need(attrs, "patch_size_level0", path, layout))
            else:  # CLAM: patch_size is at patch_level; scale by that level's downsample
                patch_size = float(_need(attrs, "patch_size", path, layout))
                level = int(_need(attrs, "patch_level", path, layout))
                downsample = attrs.get("downsample")
                if downsample is None:
                    if level != 0:
                        _need(attrs, "downsample", path, layout, f" (patch_level is {level})")
                    downsample = 1.0
                downsample = float(np.mean(np.atleast_1d(downsample)))
                size_px0 = patch_size * downsample
            tile_size_um = size_px0 * level0_mpp
            coords_um = (coords_px * level0_mpp).astype(np.float32)
            attrs["mpp"] = level0_mpp

    meta = {**attrs, "layout": layout}
    slide_id = str(root.get("slide_id") or path.stem)
    return Bag(
        feats=np.asarray(feats),
        coords_um=coords_um,
        tile_size_um=tile_size_um,
        meta=meta,
        path=path,
        slide_id=slide_id,
        coords_px=coords_px,
    )

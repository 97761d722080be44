"""Writing our bags: `features/<encoder_id>/<slide_id>.h5` in the `wsi-bag` layout, atomically.

Layout (docs/architecture.md "Bags"): `feats` (N, D) float16|float32, `coords` (N, 2) float32 top-left
in micrometres, `coords_px` (N, 2) int64 level-0 pixels, a soft link `features -> feats` (what CLAM and
TRIDENT readers look for), and as root attributes the `BagProvenance` plus unit, n_tiles, format,
format_version and feat_type ("tile", what STAMP's readers require). The file appears only when
complete (temporary name, then rename).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import h5py
import numpy as np

from wsi.core.errors import BagFormatError
from wsi.core.files import atomic_path, ensure_space
from wsi.formats.bags.format import FEAT_TYPE, FORMAT, FORMAT_VERSION, BagProvenance
from wsi.formats.bags.read import read_bag_attrs

#: on-disk feature types: float16 halves the size; float32 for features beyond its range
DTYPES = ("float16", "float32")
_CHUNK_ROWS = 1024  # feats rows per HDF5 chunk: a random subset of tiles reads few chunks


def write_bag(
    path: str | os.PathLike[str],
    *,
    feats: np.ndarray,
    coords_um: np.ndarray,
    coords_px: np.ndarray,
    provenance: BagProvenance,
    dtype: str = "float16",
) -> Path:
    """Write a bag in our layout; the file appears only when complete (temp file + rename).

    feats (N, D); coords_um (N, 2) top-left in micrometres; coords_px (N, 2) top-left in level-0 px.
    Raises BagFormatError for an unknown dtype or features that overflow float16 (nothing is written).
    """
    if dtype not in DTYPES:
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
            f"features for {provenance.slide_id} do not fit {dtype} (values beyond its range); "
            "use --dtype float32"
        )
    attrs = {
        **provenance.to_dict(),
        "unit": "um",
        "n_tiles": int(n),
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        # STAMP's train/crossval/deploy refuse a folder whose bags lack it (stamp/modeling/data.py:424-457
        # reads it when an `encoder` attribute is present); a Python str, so h5py stores UTF-8 text
        "feat_type": FEAT_TYPE,
    }
    final = Path(path)
    size = feats_out.nbytes + 24 * n + (64 << 10)  # features, coords (um, px), header
    ensure_space(final.parent, size, f"bag {final.name}")  # HDF5 must not meet a full disk mid-file
    with atomic_path(final, expected_bytes=size) as tmp, h5py.File(tmp, "w") as h5:
        h5.create_dataset("feats", data=feats_out, chunks=(min(max(n, 1), _CHUNK_ROWS), feats.shape[1]))
        h5.create_dataset("coords", data=np.asarray(coords_um, dtype=np.float32))
        h5.create_dataset("coords_px", data=np.asarray(coords_px, dtype=np.int64))
        h5["features"] = h5py.SoftLink("/feats")  # CLAM / TRIDENT readers look for `features`
        for key, value in attrs.items():
            h5.attrs[key] = value
    return final


def upgrade_bag(path: str | os.PathLike[str]) -> bool:
    """Give a bag of ours written before `feat_type` existed that attribute; True when it was added.

    Without it STAMP refuses the whole folder (old bags count as type "None", new ones as "tile"), so a
    re-run that skips finished bags upgrades them. The arrays are untouched; the file is copied, the
    attribute added to the copy, and the copy renamed over the original (never a half-written bag).
    """
    final = Path(path)
    attrs = read_bag_attrs(final)  # the one safe opener: this file is read (and copied) only if it is a bag
    if attrs.get("format") != FORMAT or "feat_type" in attrs:
        return False
    with atomic_path(final) as tmp:
        shutil.copy2(final, tmp)
        with h5py.File(tmp, "a") as h5:
            h5.attrs["feat_type"] = FEAT_TYPE
    return True

"""HDF5 attribute values as plain Python, shared by the tile-file and bag readers."""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np


def plain(value: Any) -> Any:
    """An h5py attribute value as plain Python: bytes -> str, numpy scalars and arrays -> Python."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def attrs_of(obj: h5py.HLObject) -> dict[str, Any]:
    """Every attribute of a file, group or dataset, as plain Python."""
    return {k: plain(v) for k, v in obj.attrs.items()}

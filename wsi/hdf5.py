"""HDF5 attribute values as plain Python, for the tile-file and bag modules (their one h5py helper).

h5py hands back numpy scalars, arrays and (for strings written by other tools) bytes; the file modules
compare and serialise attributes, so they read them through `attrs_of` as str, int, float and lists.
"""

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

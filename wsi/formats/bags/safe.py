"""The one way a bag file is opened: it must read only itself, declare what it stores, and fit in memory.

A bag comes from anywhere (another lab, another tool, a download), and HDF5 trusts its files: it follows
external links, external raw storage and virtual datasets into other files, serves a 10^9-row dataset
from a 14 KB file as fill values, and hands back integers, strings or compound records where features
should be. Every reader in `wsi.formats.bags` (and so train, predict, embed's re-run plan and `wsi info`)
opens bags through `open_bag_file` and takes their arrays through `feature_dataset` / `coords_dataset`, so
each of those is one BagFormatError naming the file and the reason, never a traceback, a MemoryError or
bytes read from another file. `check_fits` refuses an array larger than the memory there is before it is
allocated (predict streams such bags instead, see `fits_in_memory`).
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np

from wsi.core.errors import BagFormatError
from wsi.formats.hdf5 import human_bytes, outside_reason, storage_problem

#: feature dtypes a model can use; integers, complex numbers, strings and records are refused
FEATURE_DTYPES = ("float16", "float32", "float64")
#: share of the available memory one bag's arrays may take when loaded whole
MEMORY_SHARE = 0.5


@contextlib.contextmanager
def open_bag_file(path: Path) -> Iterator[h5py.File]:
    """The HDF5 file at `path`, read-only, after proving it reads only itself
    (`wsi.formats.hdf5.outside_reason`).

    HDF5 failures inside the block (a corrupt chunk, a link loop) become BagFormatError naming the file.
    """
    if not path.is_file():
        raise BagFormatError(f"bag {path} does not exist")
    try:
        h5 = h5py.File(path, "r")
    except OSError as exc:
        raise BagFormatError(f"{path} is not a readable HDF5 bag ({exc}); re-create it") from None
    try:
        with h5:
            try:
                reason = outside_reason(h5)
            except (OSError, RuntimeError, KeyError, ValueError) as exc:
                reason = f"its links cannot be walked ({exc})"
            if reason:
                raise BagFormatError(
                    f"{path} is refused: {reason}. A bag must hold its own data; re-create it, or copy the "
                    "data in (e.g. h5copy, or h5repack which stores external data in the file)"
                )
            yield h5
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:  # HDF5: corrupt or forged
        raise BagFormatError(f"{path}: cannot be read ({type(exc).__name__}: {exc}); re-create it") from None


def feature_dataset(h5: h5py.File, path: Path) -> h5py.Dataset:
    """The `feats` (ours, STAMP) or `features` (CLAM, TRIDENT) dataset: (N, D) floats stored in the file,
    or TRIDENT's (0,) for a slide without tissue."""
    for name in ("feats", "features"):
        if name in h5:
            ds = h5[name]
            break
    else:
        raise BagFormatError(f"{path} has neither a `feats` nor a `features` dataset")
    if not isinstance(ds, h5py.Dataset):
        raise BagFormatError(f"{path}: `{name}` is a group, not a dataset of features")
    if ds.dtype.kind != "f" or np.dtype(ds.dtype).newbyteorder("=").name not in FEATURE_DTYPES:
        raise BagFormatError(
            f"{path}: features are stored as {_dtype_name(ds.dtype)}, not float16/float32/float64; features "
            "are real numbers: re-create the bag with floating-point features"
        )
    if ds.shape != (0,) and (ds.ndim != 2 or ds.shape[1] == 0):
        raise BagFormatError(f"{path}: features of shape {ds.shape}, expected (N, D) with D >= 1")
    _check_stored(ds, path, name)
    return ds


def coords_dataset(h5: h5py.File, path: Path, name: str, n: int) -> h5py.Dataset:
    """The `coords` (or `coords_px`) dataset, (n, 2) real numbers stored in the file."""
    ds = h5.get(name)
    if not isinstance(ds, h5py.Dataset):
        raise BagFormatError(f"{path}: `{name}` is not a dataset of tile positions")
    if ds.dtype.kind not in "iuf" or ds.dtype.itemsize > 8:
        raise BagFormatError(f"{path}: `{name}` is stored as {_dtype_name(ds.dtype)}, not numbers")
    if ds.shape != (n, 2):
        raise BagFormatError(
            f"{path}: features of {n} tiles but `{name}` of shape {ds.shape}; expected ({n}, 2)"
        )
    _check_stored(ds, path, name)
    return ds


def _check_stored(ds: h5py.Dataset, path: Path, name: str) -> None:
    problem = storage_problem(ds, path.stat().st_size)
    if problem:
        raise BagFormatError(f"{path}: `{name}` {problem}; the file is damaged or forged, re-create it")


def _dtype_name(dtype: np.dtype) -> str:
    if dtype.names:
        return "compound records"
    kinds = {"i": "integers", "u": "unsigned integers", "b": "booleans", "c": "complex numbers",
             "S": "byte strings", "U": "text", "O": "variable-length data", "V": "opaque bytes"}  # fmt: skip
    return f"{kinds.get(dtype.kind, 'values')} ({dtype})"


def native(array: np.ndarray) -> np.ndarray:
    """The array in this machine's byte order (a big-endian bag reads as such; torch refuses those)."""
    if array.dtype.isnative:
        return array
    return array.astype(array.dtype.newbyteorder("="))


# ----------------------------------------------------------------------------------------------- memory
def available_memory() -> int | None:
    """Bytes this process can still allocate: the least of the system's available memory, the cgroup's
    room and the address-space limit (ulimit -v); None where none of them can be read."""
    limits: list[int] = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        cgroup = Path("/sys/fs/cgroup")
        top = (cgroup / "memory.max").read_text().strip()
        if top != "max":
            limits.append(int(top) - int((cgroup / "memory.current").read_text()))
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmSize:"):
                    limits.append(soft - int(line.split()[1]) * 1024)
    return max(0, min(limits)) if limits else None


def fits_in_memory(nbytes: int) -> bool:
    """Whether `nbytes` more stays within MEMORY_SHARE of the memory available now (True if unknown)."""
    room = available_memory()
    return room is None or nbytes <= room * MEMORY_SHARE


def check_fits(path: Path, nbytes: int, what: str) -> None:
    """BagFormatError when allocating `nbytes` for `what` would take more than MEMORY_SHARE of the memory
    available: said before allocating, rather than a MemoryError or the kernel killing the process."""
    if fits_in_memory(nbytes):
        return
    room = available_memory() or 0
    raise BagFormatError(
        f"{path}: {what} needs about {human_bytes(nbytes)}, more than half of the {human_bytes(room)} of "
        "memory available; `wsi predict` reads such bags in chunks (--stream-above-tiles), training can "
        "sample tiles (input_options.bag_size in the task), or run on a machine with more memory"
    )


__all__ = [
    "FEATURE_DTYPES",
    "MEMORY_SHARE",
    "available_memory",
    "check_fits",
    "coords_dataset",
    "feature_dataset",
    "fits_in_memory",
    "native",
    "open_bag_file",
]

"""HDF5 attribute values as plain Python, for the tile-file and bag modules (their one h5py helper).

h5py hands back numpy scalars, arrays and (for strings written by other tools) bytes; the file modules
compare and serialise attributes, so they read them through `attrs_of` as str, int, float and lists.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np

from wsi.core.json_types import JsonObject


def plain(value: Any) -> Any:
    """An h5py attribute value as plain Python: bytes -> str, numpy scalars and arrays -> Python."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


#: fields whose stored attribute (or JSON key) has another name: files keep the names earlier versions
#: wrote (and STAMP's bags use), so every version and other tools read them the same
STORED_NAMES = {"tile_um": "tile_size_um", "tile_px": "tile_size_px"}
_FIELD_NAMES = {stored: name for name, stored in STORED_NAMES.items()}


def to_stored(values: dict[str, Any]) -> dict[str, Any]:
    """Field names -> stored names (the rest as they are)."""
    return {STORED_NAMES.get(k, k): v for k, v in values.items()}


def from_stored(attrs: JsonObject) -> dict[str, Any]:
    """Stored names -> field names (the rest as they are)."""
    return {_FIELD_NAMES.get(k, k): v for k, v in attrs.items()}


def attrs_of(obj: h5py.HLObject) -> JsonObject:
    """Every attribute of a file, group or dataset, as plain Python."""
    return {k: plain(v) for k, v in obj.attrs.items()}


# ------------------------------------------------------------------------ files that read only themselves
#: links walked at most; a feature bag or tile file holds a handful, a file with more is not one of them
MAX_LINKS = 10_000
#: soft links followed through each other at most (HDF5 itself gives up at 16, with a RuntimeError)
_MAX_SOFT_HOPS = 8
#: the largest chunk a reader may have to decompress whole to read one row of it
MAX_CHUNK_BYTES = 256 << 20
#: more logical bytes per stored byte than any real compressor gives (deflate's limit is about 1032)
MAX_COMPRESSION = 2000


def outside_reason(h5: h5py.File) -> str | None:
    """Why reading this file could read something else (or never end), or None when it reads only itself.

    HDF5 follows external links, external raw storage and virtual datasets into other files when an
    object is opened or read, so a crafted bag could make a run train on any file the user can read.
    Every link is walked without following it (H5Lvisit recurses through hard links only); soft links
    are resolved by hand, so a loop or a dangling target is named instead of HDF5's RuntimeError.
    """
    links: list[tuple[bytes, int]] = []

    def visit(name: bytes, info: Any) -> int | None:
        links.append((name, info.type))
        return 1 if len(links) > MAX_LINKS else None  # a non-None return stops the walk

    h5.id.links.visit(visit, info=True)
    if len(links) > MAX_LINKS:
        return f"it holds more than {MAX_LINKS} objects, far more than a bag or tile file"
    for name, kind in links:
        shown = name.decode("utf-8", "replace")
        if kind == h5py.h5l.TYPE_EXTERNAL:
            target_file, target = (v.decode("utf-8", "replace") for v in h5.id.links.get_val(name))
            return f"`{shown}` is an external link to {target} in {target_file}"
        if kind == h5py.h5l.TYPE_SOFT:
            problem = _soft_link_problem(h5, name)
            if problem:
                return f"`{shown}` is a soft link that {problem}"
        elif kind == h5py.h5l.TYPE_HARD:
            if h5py.h5o.get_info(h5.id, name).type == h5py.h5o.TYPE_DATASET:
                problem = _dataset_outside(h5py.h5d.open(h5.id, name))
                if problem:
                    return f"dataset `{shown}` {problem}"
        else:
            return f"`{shown}` is a user-defined link (type {kind}) that this tool does not follow"
    return None


def _soft_link_problem(h5: h5py.File, name: bytes) -> str | None:
    """Resolve a soft link through hard links only; what is wrong with it, or None."""
    links = h5.id.links
    seen: set[bytes] = set()
    current = name
    for _ in range(_MAX_SOFT_HOPS):
        if current in seen:
            break
        seen.add(current)
        target = links.get_val(current)
        shown = target.decode("utf-8", "replace")
        parent = current.rsplit(b"/", 1)[0] if b"/" in current else b""
        parts = [p for p in (target if target.startswith(b"/") else parent + b"/" + target).split(b"/")]
        parts = [p for p in parts if p and p != b"."]
        resolved, kind = b"", h5py.h5l.TYPE_HARD
        for i, part in enumerate(parts):
            resolved = resolved + b"/" + part if resolved else part
            if not links.exists(resolved):
                return f"points to {shown}, which does not exist"
            kind = links.get_info(resolved).type
            if kind == h5py.h5l.TYPE_EXTERNAL:
                return (
                    f"leads out of the file through the external link `{resolved.decode('utf-8', 'replace')}`"
                )
            if kind == h5py.h5l.TYPE_SOFT and i < len(parts) - 1:
                return f"passes through another soft link (`{resolved.decode('utf-8', 'replace')}`)"
            if kind not in (h5py.h5l.TYPE_HARD, h5py.h5l.TYPE_SOFT):
                return "passes through a user-defined link"
        if kind == h5py.h5l.TYPE_HARD:
            return None  # every component a hard link: the target is an object of this file
        current = resolved  # the target is itself a soft link: follow it
    return "is part of a loop of soft links"


def _dataset_outside(dsid: Any) -> str | None:
    plist = dsid.get_create_plist()
    if plist.get_layout() == h5py.h5d.VIRTUAL:
        return "is a virtual dataset (its values live in other files)"
    if plist.get_external_count() > 0:
        return "keeps its values in an external raw file"
    return None


def storage_problem(ds: h5py.Dataset, file_size: int) -> str | None:
    """Why a dataset's declared shape is not backed by this file, or None.

    A 14 KB file may declare 10^9 rows: HDF5 serves unwritten chunks as fill values, so the reader would
    allocate gigabytes of zeros (MemoryError, or the kernel kills the process) or, worse, train on them.
    Contiguous data must all be stored inside the file; chunked data must have every chunk written, in
    chunks small enough to decompress, at a compression ratio a real compressor reaches.
    """
    nbytes = int(np.prod(ds.shape, dtype=np.float64) * ds.dtype.itemsize)
    if nbytes == 0:
        return None
    stored = int(ds.id.get_storage_size())
    plist = ds.id.get_create_plist()
    layout = plist.get_layout()
    declared = f"declares {' x '.join(map(str, ds.shape))} {ds.dtype} values ({human_bytes(nbytes)})"
    if layout == h5py.h5d.CONTIGUOUS:
        offset = ds.id.get_offset()
        if stored < nbytes or offset is None:
            return f"{declared} but stores only {human_bytes(stored)} of them"
        if offset + nbytes > file_size:
            return f"{declared} stored past the end of the {human_bytes(file_size)} file (truncated)"
    elif layout == h5py.h5d.CHUNKED:
        chunks = ds.chunks
        chunk_bytes = int(np.prod(chunks, dtype=np.float64) * ds.dtype.itemsize)
        if chunk_bytes > MAX_CHUNK_BYTES:
            return (
                f"{declared} in chunks of {human_bytes(chunk_bytes)}, each decompressed whole to read one "
                f"row (at most {human_bytes(MAX_CHUNK_BYTES)}); re-chunk it, e.g. with h5repack -l CHUNK"
            )
        expected = int(np.prod([-(-s // c) for s, c in zip(ds.shape, chunks, strict=True)], dtype=np.float64))
        written = int(ds.id.get_num_chunks())
        if written < expected:
            return f"{declared} but only {written} of its {expected} chunks are written (truncated or forged)"
        if stored > file_size or nbytes > max(stored, 1) * MAX_COMPRESSION:
            return f"{declared} in {human_bytes(stored)} of storage: more than any compressor packs"
    return None


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KB' (powers of 1024, the unit memory is sold in)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"

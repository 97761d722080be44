"""Hypothesis strategies that build hostile inputs from adversarial parts, and a memory bound to run them in.

`hostile_bags()` draws a recipe (kind + parameters) and `write_hostile_bag` makes the HDF5 file: external
links, external raw storage, virtual datasets, soft-link loops and dangling links, declared shapes far
beyond the file, wrong dtypes, NaN / infinite values, wrong shapes, truncated or non-HDF5 bytes. Every
one of them must be refused by the readers with a message naming the file, in bounded memory.
"""

from __future__ import annotations

import contextlib
import resource
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from hypothesis import strategies as st

IN_DIM = 16  # the feature width of the synthetic cohorts (tests/pipelines/train/test_train_synthetic.py)
SECRET = 4242.0  # the value other files hold: it must never reach a model

KINDS = (
    "external_link", "external_raw", "virtual", "soft_loop", "dangling", "soft_through_external",
    "huge", "dtype", "nan_feats", "nan_coords", "shape", "not_hdf5",
)  # fmt: skip
BAD_DTYPES = ("int8", "int32", "uint16", "int64", "bool", "complex64", "complex128", "S4", "compound")


@st.composite
def hostile_bags(draw: st.DrawFn) -> dict[str, Any]:
    """One hostile bag recipe: {"kind": ..., parameters}; `write_hostile_bag` turns it into a file."""
    kind = draw(st.sampled_from(KINDS))
    spec: dict[str, Any] = {"kind": kind, "n": draw(st.integers(1, 40))}
    if kind == "soft_loop":
        spec["hops"] = draw(st.integers(1, 20))
    elif kind == "huge":
        spec["rows"] = draw(st.integers(10**6, 10**12))
        spec["dim"] = draw(st.sampled_from([IN_DIM, 1, 768, 4096]))
        spec["layout"] = draw(st.sampled_from(["contiguous", "chunked", "gzip"]))
        spec["which"] = draw(st.sampled_from(["feats", "coords", "both"]))
    elif kind == "dtype":
        spec["dtype"] = draw(st.sampled_from(BAD_DTYPES))
    elif kind in ("nan_feats", "nan_coords"):
        spec["value"] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        spec["row"] = draw(st.integers(0, spec["n"] - 1))
    elif kind == "shape":
        spec["variant"] = draw(st.sampled_from(["feats_1d", "feats_3d", "coords_3", "coords_short"]))
    elif kind == "not_hdf5":
        spec["cut"] = draw(st.floats(0.0, 0.95))
        spec["noise"] = draw(st.binary(min_size=0, max_size=64))
    return spec


def _coords(n: int) -> np.ndarray:
    grid = np.arange(n)
    return np.stack([grid % 8, grid // 8], axis=1).astype(np.float32) * 256.0  # (n, 2) um


def _feats(n: int, dim: int = IN_DIM) -> np.ndarray:
    return np.random.default_rng(n).normal(size=(n, dim)).astype(np.float32)


def write_hostile_bag(spec: dict[str, Any], path: Path, helpers: Path | None = None) -> Path:
    """Write the hostile bag `spec` describes at `path`, the files it points into in `helpers` (default:
    beside it; links name them by absolute path, so HDF5 would find them); returns `path`."""
    kind, n = spec["kind"], spec["n"]
    helpers = helpers or path.parent
    helpers.mkdir(parents=True, exist_ok=True)
    other = (helpers / f"{path.stem}-other.h5").absolute()  # another file the bag must never read
    with h5py.File(other, "w") as h5:
        h5["secret"] = np.full((n, IN_DIM), SECRET, np.float32)
    if kind == "not_hdf5":
        _write_good(path, n)
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * spec["cut"])] + spec["noise"])
        return path
    with h5py.File(path, "w") as h5:
        h5.attrs["tile_size_um"] = 256.0
        h5.attrs["slide_id"] = path.stem
        coords: Any = _coords(n)
        if kind == "external_link":
            h5["feats"] = h5py.ExternalLink(str(other), "/secret")
        elif kind == "external_raw":
            raw = (helpers / f"{path.stem}.raw").absolute()
            np.full((n, IN_DIM), SECRET, np.float32).tofile(raw)
            h5.create_dataset(
                "feats", shape=(n, IN_DIM), dtype="f4", external=[(str(raw), 0, n * IN_DIM * 4)]
            )
        elif kind == "virtual":
            layout = h5py.VirtualLayout(shape=(n, IN_DIM), dtype="f4")
            layout[:] = h5py.VirtualSource(str(other), "secret", shape=(n, IN_DIM))
            h5.create_virtual_dataset("feats", layout)
        elif kind == "soft_loop":
            names = ["feats", *(f"hop{i}" for i in range(1, spec["hops"]))]
            for i, name in enumerate(names):
                h5[name] = h5py.SoftLink("/" + names[(i + 1) % len(names)])
        elif kind == "dangling":
            h5["feats"] = h5py.SoftLink("/nowhere/feats")
        elif kind == "soft_through_external":
            h5["elsewhere"] = h5py.ExternalLink(str(other), "/")
            h5["feats"] = h5py.SoftLink("/elsewhere/secret")
        elif kind == "huge":
            _huge(h5, spec, coords)
            return path
        elif kind == "dtype":
            h5["feats"] = _bad_dtype(spec["dtype"], n)
        elif kind == "nan_feats":
            feats = _feats(n)
            feats[spec["row"], spec["row"] % IN_DIM] = spec["value"]
            h5["feats"] = feats
        elif kind == "nan_coords":
            coords[spec["row"], 1] = spec["value"]
            h5["feats"] = _feats(n)
        elif kind == "shape":
            variant = spec["variant"]
            shaped = {"feats_1d": _feats(n)[:, 0], "feats_3d": _feats(n)[:, :, None]}
            h5["feats"] = shaped.get(variant, _feats(n))
            short = _coords(n)[:-1]  # one position fewer than tiles
            coords = {"coords_3": np.zeros((n, 3), np.float32), "coords_short": short}.get(variant, coords)
        h5["coords"] = coords
    return path


def _huge(h5: h5py.File, spec: dict[str, Any], coords: np.ndarray) -> None:
    rows, dim, layout = spec["rows"], spec["dim"], spec["layout"]
    opts: dict[str, Any] = {}
    if layout != "contiguous":
        opts["chunks"] = (min(rows, 1024), min(dim, 64))
    if layout == "gzip":
        opts["compression"] = "gzip"

    def declare(name: str, shape: tuple[int, int]) -> None:
        chunks = opts.get("chunks")
        extra = {**opts, "chunks": (min(shape[0], 1024), min(shape[1], chunks[1]))} if chunks else {}
        h5.create_dataset(name, shape=shape, dtype="f4", **extra)

    which = spec["which"]
    if which in ("feats", "both"):
        declare("feats", (rows, dim))
    else:
        h5["feats"] = _feats(spec["n"])
    if which in ("coords", "both"):
        declare("coords", (rows, 2))
    else:
        h5["coords"] = coords


def _bad_dtype(name: str, n: int) -> np.ndarray:
    if name == "compound":
        return np.zeros((n,), dtype=[("a", "f4"), ("b", "f4")])
    if name == "S4":
        return np.full((n, IN_DIM), b"1.0", dtype="S4")
    return (_feats(n) * 10).astype(name)


def _write_good(path: Path, n: int) -> None:
    with h5py.File(path, "w") as h5:
        h5.attrs["tile_size_um"] = 256.0
        h5["feats"] = _feats(n)
        h5["coords"] = _coords(n)


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


@contextlib.contextmanager
def bounded_memory(extra: int = 2 << 30) -> Iterator[None]:
    """Run the block with at most `extra` more bytes of address space (RLIMIT_AS): an allocation beyond
    it raises MemoryError in the test instead of swapping the machine. The soft limit is restored after
    (only the soft limit is lowered, so it can be raised again)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def write_declared_size_bomb(
    path: Path,
    side_px: int,
    *,
    tile_px: int = 256,
    mpp: float = 0.5,
    filled: tuple[tuple[int, int], ...] = (),
) -> Path:
    """A tiled BigTIFF whose header declares `side_px` x `side_px` RGB pixels while every tile but the
    `filled` (col, row) ones is absent (offset and byte count 0, which libtiff and OpenSlide read as
    empty): a 200,000 px side is a 10 MB file of tile tables, written in a fraction of a second. Its
    resolution tags say `mpp` um/px."""
    n_across = -(-side_px // tile_px)
    n = n_across * n_across
    tile = np.empty((tile_px, tile_px, 3), np.uint8)
    tile[:] = (200, 120, 170)  # eosin pink: tissue, where a tile is stored
    data = tile.tobytes()
    offsets, counts = np.zeros(n, "<u8"), np.zeros(n, "<u8")
    # (tag, type, count, value): 3 SHORT, 4 LONG, 5 RATIONAL, 16 LONG8; sorted by tag as TIFF requires
    entries = [
        (256, 4, 1, side_px), (257, 4, 1, side_px), (258, 3, 3, None), (259, 3, 1, 1), (262, 3, 1, 2),
        (277, 3, 1, 3), (282, 5, 1, None), (283, 5, 1, None), (284, 3, 1, 1), (296, 3, 1, 3),
        (322, 4, 1, tile_px), (323, 4, 1, tile_px), (324, 16, n, None), (325, 16, n, None),
    ]  # fmt: skip
    ifd_at = 16
    arrays_at = ifd_at + 8 + 20 * len(entries) + 8
    tiles_at = arrays_at + 16 * n
    for k, (col, row) in enumerate(filled):
        offsets[row * n_across + col] = tiles_at + k * len(data)
        counts[row * n_across + col] = len(data)
    inline = {
        258: struct.pack("<HHH", 8, 8, 8), 282: struct.pack("<II", round(1e4 / mpp), 1),
        283: struct.pack("<II", round(1e4 / mpp), 1), 324: struct.pack("<Q", arrays_at),
        325: struct.pack("<Q", arrays_at + 8 * n),
    }  # fmt: skip
    out = bytearray(b"II" + struct.pack("<HHHQ", 43, 8, 0, ifd_at) + struct.pack("<Q", len(entries)))
    for tag, typ, count, value in entries:
        raw = inline.get(tag) or struct.pack("<H" if typ == 3 else "<I", value)
        out += struct.pack("<HHQ", tag, typ, count) + raw.ljust(8, b"\0")
    out += struct.pack("<Q", 0) + offsets.tobytes() + counts.tobytes() + data * len(filled)
    path.write_bytes(bytes(out))
    return path

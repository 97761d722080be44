"""Refusing bags that would poison a model: non-finite features, unreadable or empty files.

One NaN in one bag makes every weight of a model NaN after a single step, and a run that keeps going
reports metrics computed from NaN probabilities. So features are checked where bags are loaded for
training and prediction (`check_finite`), and `find_bad_bags` scans a whole list before training starts,
so that a run is refused once, naming every bad bag, instead of dying at the first one hours in.

The scan reads each bag's features in row blocks of at most `max_block_bytes`, so memory stays bounded
whatever the bag's size (a bag of a large slide at float32 can hold gigabytes).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wsi.core.errors import BagFormatError
from wsi.formats.bags.read import Bag, BagHeader, BagStream, read_bag_header
from wsi.formats.bags.safe import coords_dataset, feature_dataset, open_bag_file

#: the largest block of feature rows read at once by `find_bad_bags`
_BLOCK_BYTES = 32 << 20


class NonFiniteFeaturesError(BagFormatError):
    """A bag holds NaN or infinite features."""


@dataclass(frozen=True)
class BadBag:
    """A bag that cannot be used, and why (the message names the file)."""

    path: Path
    reason: str  # one line naming the file and what is wrong
    n_nonfinite: int = 0  # rows with at least one NaN or infinite value (0: bad for another reason)
    n_rows: int = 0  # rows in the bag, when readable


def nonfinite_message(path: Path, n_bad: int, n_rows: int) -> str:
    return (
        f"{path}: {n_bad} of {n_rows} tiles have NaN or infinite features; a model trained or evaluated "
        "on them is meaningless: re-embed the slide (`wsi embed ... --overwrite`) or leave the bag out"
    )


def count_nonfinite_rows(feats: np.ndarray) -> int:
    """Rows (tiles) of an (N, D) feature array with at least one NaN or infinite value."""
    feats = np.asarray(feats)
    if feats.size == 0:
        return 0
    rows = feats.reshape(len(feats), -1)
    step = max(1, (4 << 20) // max(1, rows.shape[1]))  # bool temporaries of at most 4 MB
    finite = sum(int(np.isfinite(rows[i : i + step]).all(axis=1).sum()) for i in range(0, len(rows), step))
    return len(feats) - finite


def check_finite(bag: Bag) -> None:
    """Raise NonFiniteFeaturesError naming the bag file and how many tiles are not finite."""
    n_bad = count_nonfinite_rows(bag.feats)
    if n_bad:
        raise NonFiniteFeaturesError(nonfinite_message(bag.path, n_bad, len(bag)))


def finite_chunks(stream: BagStream, size: int) -> Iterator[np.ndarray]:
    """`stream.chunks(size)`, raising NonFiniteFeaturesError at the first chunk with a NaN or
    infinite feature (the check `check_finite` makes on a loaded bag, without loading it)."""
    start = 0
    for feats in stream.chunks(size):
        n_bad = count_nonfinite_rows(feats)
        if n_bad:
            where = f"rows {start}-{start + len(feats) - 1}"
            raise NonFiniteFeaturesError(
                nonfinite_message(stream.bag.path, n_bad, stream.n_tiles).replace(
                    " tiles have", f" tiles ({where}) have", 1
                )
            )
        start += len(feats)
        yield feats


def scan_bag(path: str | os.PathLike[str], *, max_block_bytes: int = _BLOCK_BYTES) -> BadBag | None:
    """None for a usable bag, else what is wrong with it; features read in bounded row blocks."""
    path = Path(path)
    try:
        header = read_bag_header(path)
        if header.n_tiles == 0:
            return BadBag(path, _empty_message(path))
        row_bytes = max(1, header.dim * np.dtype(header.dtype).itemsize)
        block = max(1, max_block_bytes // row_bytes)
        n_bad = 0
        with open_bag_file(path) as h5:
            ds = feature_dataset(h5, path)
            coords = coords_dataset(h5, path, "coords", header.n_tiles)
            if not np.isfinite(coords[()]).all():  # (N, 2): small beside the features
                return BadBag(
                    path, f"{path}: tile positions (`coords`) hold NaN or infinite values; re-create it"
                )
            for start in range(0, header.n_tiles, block):
                n_bad += count_nonfinite_rows(ds[start : start + block])
    except BagFormatError as exc:
        return BadBag(path, str(exc))
    except (OSError, KeyError, ValueError, TypeError) as exc:  # corrupt chunks, odd dtypes
        return BadBag(path, f"{path}: cannot read its features ({type(exc).__name__}: {exc}); re-create it")
    if n_bad:
        return BadBag(path, nonfinite_message(path, n_bad, header.n_tiles), n_bad, header.n_tiles)
    return None


def scan_bag_header(
    path: str | os.PathLike[str], *, attr_names: tuple[str, ...] | None = None
) -> tuple[BagHeader | None, BadBag | None]:
    """What `scan_bag` finds without reading a feature or a position: a file that is no readable bag, or
    an empty one. With the header when it reads, so that thousands of bags are judged in seconds
    (`wsi info FOLDER`); NaN features take `scan_bag`. `attr_names` as in `read_bag_header`."""
    path = Path(path)
    try:
        header = read_bag_header(path, attr_names=attr_names)
    except BagFormatError as exc:
        return None, BadBag(path, str(exc))
    except (OSError, KeyError, ValueError, TypeError) as exc:  # as scan_bag: corrupt or odd files
        return None, BadBag(path, f"{path}: cannot read it ({type(exc).__name__}: {exc}); re-create it")
    return header, (BadBag(path, _empty_message(path)) if header.n_tiles == 0 else None)


def _empty_message(path: Path) -> str:
    return f"{path} holds no tiles: an empty slide, nothing to learn or predict from"


def find_bad_bags(
    paths: Iterable[str | os.PathLike[str]], *, max_block_bytes: int = _BLOCK_BYTES
) -> list[BadBag]:
    """Every unusable bag among `paths` (non-finite features, unreadable, empty), in the order given.

    Call it before training: refuse the run listing all of them, rather than failing at the first.
    """
    found = (scan_bag(p, max_block_bytes=max_block_bytes) for p in paths)
    return [bad for bad in found if bad is not None]

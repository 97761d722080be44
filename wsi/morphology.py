"""The few operations of skimage.morphology (and skimage.segmentation.find_boundaries and
skimage.measure.label, which import it) that every tile run uses, written on scipy.ndimage.

Importing skimage.morphology loads scipy.spatial, scipy.sparse and scipy.linalg for other functions
(0.15-0.4 s per process, most of what `wsi tile` imported after numpy and scipy.ndimage), while these
are a few lines over scipy.ndimage. They return the same arrays as skimage 0.26's functions of the same
names (tests/test_morphology.py compares them): a disk footprint has odd sides and is symmetric, so
skimage's padding and mirroring of footprints change nothing, and its default border mode, "reflect",
is passed to scipy as it is.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

#: row half-widths up to this are run as shifted copies, longer ones by scipy's running filter
_SHIFTED_MAX = 3


def disk(radius: int) -> np.ndarray:
    """(2r + 1, 2r + 1) uint8 footprint: 1 where x^2 + y^2 <= r^2 (skimage.morphology.disk)."""
    steps = np.arange(-radius, radius + 1)
    x, y = np.meshgrid(steps, steps)
    return np.asarray(x**2 + y**2 <= radius**2, dtype=np.uint8)


def dilation(image: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """Grey (or binary) dilation: the largest value under the footprint, the image mirrored past its
    edges (scipy's "reflect")."""
    return _disk_filter(image, footprint, np.maximum) if _rows(footprint) else _grey(image, footprint, True)


def erosion(image: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """Grey (or binary) erosion: the smallest value under the footprint (edges as `dilation`)."""
    return _disk_filter(image, footprint, np.minimum) if _rows(footprint) else _grey(image, footprint, False)


def closing(image: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """Grey (or binary) closing with a symmetric odd-sided footprint: dilation, then erosion."""
    return erosion(dilation(image, footprint), footprint)


def opening(image: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """Grey (or binary) opening with a symmetric odd-sided footprint: erosion, then dilation."""
    return dilation(erosion(image, footprint), footprint)


def _grey(image: np.ndarray, footprint: np.ndarray, dilate: bool) -> np.ndarray:
    fn = ndimage.grey_dilation if dilate else ndimage.grey_erosion
    return np.asarray(fn(image, footprint=footprint, mode="reflect"))


def _rows(footprint: np.ndarray) -> list[int] | None:
    """Each row's half-width when the footprint is a disk-like shape (odd sides, every row one run
    centred on the middle column, symmetric top to bottom); None otherwise."""
    fp = np.asarray(footprint, dtype=bool)
    if fp.ndim != 2 or fp.shape[0] % 2 == 0 or fp.shape[1] % 2 == 0 or not np.array_equal(fp, fp[::-1]):
        return None
    centre = fp.shape[1] // 2
    halves = []
    for row in fp:
        n = int(row.sum())
        if n % 2 == 0 or not row[centre - n // 2 : centre + n // 2 + 1].all():
            return None  # an empty row, or one that is not a single centred run
        halves.append(n // 2)
    return halves


def _disk_filter(image: np.ndarray, footprint: np.ndarray, reduce: np.ufunc) -> np.ndarray:
    """The max (or min) under a disk-like footprint as one 1-D running max per row width, then the max
    of the shifted rows: O(pixels x footprint height) instead of O(pixels x footprint area) (a 13 px
    disk on a 500 px thumbnail: ~10x faster), and exactly scipy's result (a max is a max)."""
    halves = _rows(footprint)
    assert halves is not None
    r = len(halves) // 2
    src = np.asarray(image)
    bool_in = src.dtype == bool
    if bool_in:
        src = src.view(np.uint8)
    if r >= src.shape[0] or max(halves) >= src.shape[1]:  # smaller than the footprint: scipy's own way
        return _grey(image, footprint, reduce is np.maximum)
    padded = np.pad(src, ((r, r), (0, 0)), mode="symmetric")  # numpy "symmetric" is scipy "reflect"
    runs = {w: _running(padded, w, reduce) for w in set(halves)}
    h = src.shape[0]
    out = runs[halves[0]][0:h].copy()
    for dy, w in enumerate(halves[1:], start=1):
        reduce(out, runs[w][dy : dy + h], out=out)
    return out.view(bool) if bool_in else out


def _running(rows: np.ndarray, w: int, reduce: np.ufunc) -> np.ndarray:
    """The max (min) of each pixel's row neighbours within `w` px, the rows mirrored past their ends:
    shifted copies for a short run (a few passes over memory), scipy's 1-D filter for a long one."""
    if w == 0:
        return rows
    if w > _SHIFTED_MAX:
        run = ndimage.maximum_filter1d if reduce is np.maximum else ndimage.minimum_filter1d
        return np.asarray(run(rows, 2 * w + 1, axis=1, mode="reflect"))
    wide = np.pad(rows, ((0, 0), (w, w)), mode="symmetric")
    n = rows.shape[1]
    out = wide[:, : n].copy()
    for dx in range(1, 2 * w + 1):
        reduce(out, wide[:, dx : dx + n], out=out)
    return out


def black_tophat(image: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """The closing minus the image: dark details narrower than the footprint."""
    closed = closing(image, footprint)
    if closed.dtype == bool:
        return np.logical_xor(closed, image)
    closed -= image
    return closed


def find_boundaries(mask: np.ndarray, mode: str = "thick") -> np.ndarray:
    """(H, W) bool: the pixels where a bool `mask` meets its outside (4-neighbours), on both sides
    ("thick") or inside the mask only ("inner"), as skimage.segmentation.find_boundaries."""
    if mode not in ("thick", "inner"):
        raise ValueError(f"find_boundaries: mode must be 'thick' or 'inner', not {mode!r}")
    image = np.asarray(mask, dtype=bool)
    # max != min over the pixel and its 4 neighbours (mirrored past the edge: the same pixel) means, for
    # a binary image, some neighbour differs from the pixel
    edges = np.zeros(image.shape, bool)
    for axis in range(image.ndim):
        step = np.not_equal(*_neighbours(image, axis))
        _neighbours(edges, axis)[0][...] |= step
        _neighbours(edges, axis)[1][...] |= step
    return edges & image if mode == "inner" else edges


def _neighbours(a: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Views of `a` without its last and without its first index along `axis`: each pixel and the next."""
    head, tail = [slice(None)] * a.ndim, [slice(None)] * a.ndim
    head[axis], tail[axis] = slice(None, -1), slice(1, None)
    return a[tuple(head)], a[tuple(tail)]


def label(mask: np.ndarray, connectivity: int = 2) -> np.ndarray:
    """int32 labels 1..n of the connected parts of a bool `mask` (0 outside), numbered in raster order of
    their first pixel, as skimage.measure.label (which imports skimage.morphology when called)."""
    labels, _ = ndimage.label(mask, ndimage.generate_binary_structure(mask.ndim, connectivity))
    return np.asarray(labels)


def remove_small_objects(mask: np.ndarray, *, max_size: int, connectivity: int = 1) -> np.ndarray:
    """A copy of the bool `mask` without its connected parts of at most `max_size` pixels."""
    out = np.array(mask, dtype=bool, copy=True)
    if max_size == 0:
        return out
    labels = np.zeros(out.shape, np.int32)
    ndimage.label(out, ndimage.generate_binary_structure(out.ndim, connectivity), output=labels)
    too_small = np.bincount(labels.ravel()) <= max_size
    too_small[0] = False  # outside every part: nothing to remove
    if too_small.any():
        out[too_small[labels]] = False
    return out


def remove_small_holes(mask: np.ndarray, *, max_size: int, connectivity: int = 1) -> np.ndarray:
    """A copy of the bool `mask` with its holes (connected parts of ~mask, at the image edge or not) of
    at most `max_size` pixels filled."""
    return ~remove_small_objects(~np.asarray(mask, dtype=bool), max_size=max_size, connectivity=connectivity)


__all__ = [
    "black_tophat",
    "closing",
    "dilation",
    "disk",
    "erosion",
    "find_boundaries",
    "label",
    "opening",
    "remove_small_holes",
    "remove_small_objects",
]

"""Binary and grey morphology for whole-slide thumbnails, on scipy.ndimage.

Two families, one idea: (1) the few operations of skimage.morphology (with find_boundaries and
skimage.measure.label) that every tile run uses, returning the same arrays as skimage 0.26's functions
of the same names (tests/wsi/tiling/test_morphology.py compares them) without importing skimage.morphology,
which loads scipy.spatial, scipy.sparse and scipy.linalg (0.15-0.4 s per process); (2) disks given by a
radius in pixels (`dilate_disk`, `erode_disk`, `open_disk`, `close_disk`) whose cost grows little with the
radius (row maxima under the disk up to 16 px, a distance transform for larger ones), and
`block_reduce` for downsampling.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage


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
    """The max (or min) under a disk-like footprint as the running max of each row width (`_running`),
    then the max of the shifted rows: O(pixels x footprint height) instead of O(pixels x footprint area)
    (a 13 px disk on a 500 px thumbnail: ~10x faster), and exactly scipy's result (a max is a max)."""
    halves = _rows(footprint)
    assert halves is not None
    r = len(halves) // 2
    src = np.asarray(image)
    bool_in = src.dtype == bool
    if bool_in:
        src = src.view(np.uint8)
    # numpy's "symmetric" is scipy's "reflect", and stays defined for an image smaller than the footprint
    # (scipy's and skimage's own filters read past such an image's memory: NaN or noise at random)
    padded = np.pad(src, ((r, r), (0, 0)), mode="symmetric")
    runs = _running(padded, set(halves), reduce)
    h = src.shape[0]
    out = runs[halves[0]][0:h].copy()
    for dy, w in enumerate(halves[1:], start=1):
        reduce(out, runs[w][dy : dy + h], out=out)
    return out.view(bool) if bool_in else out


def _running(rows: np.ndarray, widths: set[int], reduce: np.ufunc) -> dict[int, np.ndarray]:
    """Width -> the max (min) of each pixel's row neighbours within that many px, the rows mirrored past
    their ends, for every width in `widths` in one sweep: the run of width w is that of w - 1 and the two
    pixels w away (two passes over memory per width, where scipy's 1-D filter per width cost 1-2 ms on
    a 625 px map; a max is a max: the same values)."""
    top = max(widths)
    wide = np.pad(rows, ((0, 0), (top, top)), mode="symmetric") if top else rows
    n = rows.shape[1]
    run = wide[:, top : top + n].copy()
    out = {0: rows} if 0 in widths else {}
    for w in range(1, top + 1):
        reduce(run, wide[:, top - w : top - w + n], out=run)
        reduce(run, wide[:, top + w : top + w + n], out=run)
        if w in widths:
            out[w] = run.copy() if w < top else run
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
    if not mask.any():  # most masks asked about on most slides (no red, brown or yellow ink): 1 ms each
        return np.zeros(mask.shape, np.int32)
    labels, _ = ndimage.label(mask, ndimage.generate_binary_structure(mask.ndim, connectivity))
    return np.asarray(labels)


def remove_small_objects(mask: np.ndarray, *, max_size: int, connectivity: int = 1) -> np.ndarray:
    """A copy of the bool `mask` without its connected parts of at most `max_size` pixels."""
    out = np.array(mask, dtype=bool, copy=True)
    if max_size == 0 or not out.any():
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


#: radii (px) up to this, whole or not, are the max (min) under their footprint, row by row
_SMALL_R = 4
#: ... and whole radii up to this too (its cost grows with the radius, the distance transform's not)
_ROWS_MAX_R = 16


def _disk(r: float) -> np.ndarray:
    n = int(np.floor(r))
    ys, xs = np.mgrid[-n : n + 1, -n : n + 1]
    return np.asarray(ys * ys + xs * xs <= r * r)


def dilate_disk(mask: np.ndarray, r: float) -> np.ndarray:
    """Pixels within `r` px (Euclidean) of `mask`."""
    if r < 1 or not mask.any():
        return mask.copy()
    if r <= _SMALL_R or (r == int(r) and r <= _ROWS_MAX_R):
        return _by_rows(mask, r, dilate=True)
    return np.asarray(ndimage.distance_transform_edt(~mask)) <= r


def erode_disk(mask: np.ndarray, r: float) -> np.ndarray:
    """Pixels of `mask` at least `r` px from anything outside it (beyond the image edge is inside)."""
    if r < 1 or not mask.any():
        return mask.copy()
    # an all-mask image: scipy's transform measures to the image edge instead, kept as it was
    if r <= _SMALL_R or (r == int(r) and r <= _ROWS_MAX_R and not mask.all()):
        return _by_rows(mask, r, dilate=False)
    return np.asarray(ndimage.distance_transform_edt(mask)) > r


def _by_rows(mask: np.ndarray, r: float, *, dilate: bool) -> np.ndarray:
    """`dilate_disk` / `erode_disk` as the max (min) under the footprint x^2 + y^2 <= r^2, row by row
    (`_disk_filter`), the mask padded by floor(r) px of nothing (of mask, eroding). For a small radius,
    the pixels of scipy's binary_dilation (binary_erosion, border 1) with that footprint, at a tenth of
    their cost; for a whole one, those of the distance transform (an integer's square root is exact, so
    "distance <= r" is "x^2 + y^2 <= r^2"), at a third of its cost on a 625 px map
    (tests/wsi/tiling/test_artifacts.py and test_morphology.py compare them)."""
    n = int(r)
    padded = np.pad(np.asarray(mask, dtype=bool), n, constant_values=not dilate)
    out = (dilation if dilate else erosion)(padded, _disk(r).astype(np.uint8))
    return np.ascontiguousarray(out[n:-n, n:-n])


def dilate_disk_on_blocks(mask: np.ndarray, r: float, block: int) -> np.ndarray:
    """`dilate_disk` measured on blocks of `block` px: the blocks within r / block blocks of a block
    holding `mask`, back at full size. Within about a block of `r` either way, at 1 / block^2 of the cost, for
    "near" questions whose answer needs no pixel's precision (dust far from tissue, a stroke's reach)."""
    if block <= 1:
        return dilate_disk(mask, r)
    h, w = mask.shape
    coarse = block_reduce(np.asarray(mask, dtype=bool), block, how="max")
    near = dilate_disk(coarse, r / block)
    return np.repeat(np.repeat(near, block, axis=0), block, axis=1)[:h, :w]


def open_disk(mask: np.ndarray, r: float) -> np.ndarray:
    """The parts of `mask` a disk of radius `r` (rounded to whole px) fits in: thinner parts removed."""
    r = round(r)
    return dilate_disk(erode_disk(mask, r), r) & mask if r >= 1 else mask


def close_disk(mask: np.ndarray, r: float) -> np.ndarray:
    """`mask` with gaps narrower than about 2r (r rounded to whole px) filled."""
    r = round(r)
    return erode_disk(dilate_disk(mask, r), r) | mask if r >= 1 else mask


def block_reduce(image: np.ndarray, factor: int, how: str = "mean") -> np.ndarray:
    """(H, W, ...) -> (ceil(H/f), ceil(W/f), ...): the mean (or min, max) of each f x f block; the last
    partial blocks are padded with their edge values so every pixel counts once."""
    if factor <= 1:
        return image
    h, w = image.shape[:2]
    ph, pw = -h % factor, -w % factor
    if ph or pw:
        pad = [(0, ph), (0, pw)] + [(0, 0)] * (image.ndim - 2)
        image = np.pad(image, pad, mode="edge")
    if image.dtype.kind in "bu" and image.dtype.itemsize == 1 and factor <= 16:  # sums fit uint16
        return _block_reduce_bytes(image, factor, how)
    # one strided slice per offset in the block: far faster than reducing a 4-D reshape's axes
    parts = (image[i::factor, j::factor] for i in range(factor) for j in range(factor))
    if how in ("min", "max"):
        out = next(parts).copy()
        for part in parts:
            (np.minimum if how == "min" else np.maximum)(out, part, out=out)
        return out
    total = next(parts).astype(np.float32)
    for part in parts:
        total += part
    total /= factor * factor
    return total


def _block_reduce_bytes(image: np.ndarray, factor: int, how: str) -> np.ndarray:
    """`block_reduce` of a uint8 or bool image whose sides are multiples of `factor`: the block's rows
    first (whole rows, contiguous), then its columns (each pixel's channels together), 1.3-1.8x faster
    than a slice per offset. The same values: the sums are whole numbers, exact in uint16 and float32."""
    rows = image[0::factor].astype(np.uint16) if how == "mean" else image[0::factor].copy()
    reduce = np.add if how == "mean" else np.minimum if how == "min" else np.maximum
    for i in range(1, factor):
        reduce(rows, image[i::factor], out=rows)
    h, w = rows.shape[:2]
    columns = rows.reshape(h, w // factor, factor, -1)  # (h, w', f, channels)
    out = columns[:, :, 0].astype(np.float32) if how == "mean" else columns[:, :, 0].copy()
    for j in range(1, factor):
        reduce(out, columns[:, :, j], out=out)
    if how == "mean":
        out /= factor * factor
    return out.reshape((h, w // factor, *image.shape[2:]))


__all__ = [
    "black_tophat",
    "block_reduce",
    "close_disk",
    "closing",
    "dilate_disk",
    "dilate_disk_on_blocks",
    "dilation",
    "disk",
    "erode_disk",
    "erosion",
    "find_boundaries",
    "label",
    "open_disk",
    "opening",
    "remove_small_holes",
    "remove_small_objects",
]

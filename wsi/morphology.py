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


def disk(radius: int) -> np.ndarray:
    """(2r + 1, 2r + 1) uint8 footprint: 1 where x^2 + y^2 <= r^2 (skimage.morphology.disk)."""
    steps = np.arange(-radius, radius + 1)
    x, y = np.meshgrid(steps, steps)
    return np.asarray(x**2 + y**2 <= radius**2, dtype=np.uint8)


def closing(image: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """Grey (or binary) closing with a symmetric odd-sided footprint: dilation, then erosion."""
    dilated = ndimage.grey_dilation(image, footprint=footprint, mode="reflect")
    return np.asarray(ndimage.grey_erosion(dilated, footprint=footprint, mode="reflect"))


def opening(image: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """Grey (or binary) opening with a symmetric odd-sided footprint: erosion, then dilation."""
    eroded = ndimage.grey_erosion(image, footprint=footprint, mode="reflect")
    return np.asarray(ndimage.grey_dilation(eroded, footprint=footprint, mode="reflect"))


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
    image = np.asarray(mask, dtype=bool).astype(np.uint8)
    cross = ndimage.generate_binary_structure(image.ndim, 1)
    edges = np.asarray(
        ndimage.grey_dilation(image, footprint=cross, mode="reflect")
        != ndimage.grey_erosion(image, footprint=cross, mode="reflect")
    )
    return edges & (image != 0) if mode == "inner" else edges


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
    out[too_small[labels]] = False
    return out


def remove_small_holes(mask: np.ndarray, *, max_size: int, connectivity: int = 1) -> np.ndarray:
    """A copy of the bool `mask` with its holes (connected parts of ~mask, at the image edge or not) of
    at most `max_size` pixels filled."""
    return ~remove_small_objects(~np.asarray(mask, dtype=bool), max_size=max_size, connectivity=connectivity)


__all__ = [
    "black_tophat",
    "closing",
    "disk",
    "find_boundaries",
    "label",
    "opening",
    "remove_small_holes",
    "remove_small_objects",
]

"""Binary morphology with disks, and block downsampling, both fast on a whole slide's thumbnail.

A small disk (radius up to `_SMALL_R` px) is a footprint (scipy's binary erosion, cost ~ its area);
a larger one is a Euclidean distance transform (O(pixels) whatever the radius), where footprint-based
operations grow with the radius (skimage's 12 px disk on a 3000 px thumbnail: seconds)."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from wsi.morphology import dilation, erosion

#: radii (px) up to this use a footprint, larger ones a distance transform
_SMALL_R = 4
#: ... or, up to this and whole, a row-by-row max/min (its cost grows with the radius, the transform's not)
_ROWS_MAX_R = 16


def _disk(r: float) -> np.ndarray:
    n = int(np.floor(r))
    ys, xs = np.mgrid[-n : n + 1, -n : n + 1]
    return np.asarray(ys * ys + xs * xs <= r * r)


def dilate(mask: np.ndarray, r: float) -> np.ndarray:
    """Pixels within `r` px (Euclidean) of `mask`."""
    if r < 1 or not mask.any():
        return mask.copy()
    if r <= _SMALL_R:
        return np.asarray(ndimage.binary_dilation(mask, structure=_disk(r)))
    if r == int(r) and r <= _ROWS_MAX_R:
        return _by_rows(mask, int(r), dilate=True)
    return np.asarray(ndimage.distance_transform_edt(~mask)) <= r


def erode(mask: np.ndarray, r: float) -> np.ndarray:
    """Pixels of `mask` at least `r` px from anything outside it (beyond the image edge is inside)."""
    if r < 1 or not mask.any():
        return mask.copy()
    if r <= _SMALL_R:
        return np.asarray(ndimage.binary_erosion(mask, structure=_disk(r), border_value=1))
    # an all-mask image: scipy's transform measures to the image edge instead, kept as it was
    if r == int(r) and r <= _ROWS_MAX_R and not mask.all():
        return _by_rows(mask, int(r), dilate=False)
    return np.asarray(ndimage.distance_transform_edt(mask)) > r


def _by_rows(mask: np.ndarray, r: int, *, dilate: bool) -> np.ndarray:
    """`dilate` / `erode` by a whole-pixel radius as the max (min) under the disk x^2 + y^2 <= r^2, row by
    row (`wsi.morphology`), the mask padded by r px of nothing (of mask, eroding): the same pixels as the
    distance transform (an integer's square root is exact, so "distance <= r" is "x^2 + y^2 <= r^2"), at
    a third of its cost on a 625 px map (tests/wsi/test_artifacts.py compares them)."""
    padded = np.pad(np.asarray(mask, dtype=bool), r, constant_values=not dilate)
    out = (dilation if dilate else erosion)(padded, _disk(r).astype(np.uint8))
    return np.ascontiguousarray(out[r:-r, r:-r])


def opening(mask: np.ndarray, r: float) -> np.ndarray:
    """The parts of `mask` a disk of radius `r` (rounded to whole px) fits in: thinner parts removed."""
    r = round(r)
    return dilate(erode(mask, r), r) & mask if r >= 1 else mask


def closing(mask: np.ndarray, r: float) -> np.ndarray:
    """`mask` with gaps narrower than about 2r (r rounded to whole px) filled."""
    r = round(r)
    return erode(dilate(mask, r), r) | mask if r >= 1 else mask


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

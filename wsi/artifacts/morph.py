"""Binary morphology with disks, and block downsampling, both fast on a whole slide's thumbnail.

A small disk (radius up to `_SMALL_R` px) is a footprint (scipy's binary erosion, cost ~ its area);
a larger one is a Euclidean distance transform (O(pixels) whatever the radius), where footprint-based
operations grow with the radius (skimage's 12 px disk on a 3000 px thumbnail: seconds)."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

#: radii (px) up to this use a footprint, larger ones a distance transform
_SMALL_R = 4


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
    return np.asarray(ndimage.distance_transform_edt(~mask)) <= r


def erode(mask: np.ndarray, r: float) -> np.ndarray:
    """Pixels of `mask` at least `r` px from anything outside it (beyond the image edge is inside)."""
    if r < 1 or not mask.any():
        return mask.copy()
    if r <= _SMALL_R:
        return np.asarray(ndimage.binary_erosion(mask, structure=_disk(r), border_value=1))
    return np.asarray(ndimage.distance_transform_edt(mask)) > r


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

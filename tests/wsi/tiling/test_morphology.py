"""wsi.tiling.morphology gives the same arrays as skimage.morphology, whose import it avoids (issue 35)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage
from skimage import morphology as sk
from skimage.measure import label
from skimage.segmentation import find_boundaries

from wsi.tiling import morphology as ours


def _masks() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for shape, p, sigma in (((60, 80), 0.5, 1.0), ((97, 61), 0.3, 2.5), ((40, 40), 0.7, 0.0)):
        noise = rng.random(shape) < p
        out.append(ndimage.gaussian_filter(noise.astype(float), sigma) > 0.4 if sigma else noise)
    return [*out, np.zeros((7, 9), bool)]  # empty: labelled without a pass (issue 41)


@pytest.mark.parametrize("radius", [0, 1, 2, 3, 5, 8])
def test_disk(radius: int) -> None:
    assert np.array_equal(ours.disk(radius), sk.disk(radius))
    assert ours.disk(radius).dtype == sk.disk(radius).dtype


@pytest.mark.parametrize("radius", [1, 2, 4, 6, 12])
@pytest.mark.parametrize("shape", [(50, 70), (9, 31), (3, 3), (14, 5)])
def test_dilation_erosion_closing_opening_and_black_tophat(radius: int, shape: tuple[int, int]) -> None:
    """Row by row (`_disk_filter`): the same arrays as skimage's, edges (mirrored) included, for bool,
    float and uint8 images. skimage is given the image already mirrored past its edges, far enough for
    two passes, and cropped: on an image smaller than the disk its own reflection reads past the
    image's memory (a NaN, at random), ours does not."""
    rng = np.random.default_rng(radius)
    grey = rng.random(shape)
    footprint = sk.disk(radius)
    pad = 3 * radius
    for image in [*_masks(), grey > 0.6, grey.astype(np.float32), (grey * 255).astype(np.uint8)]:
        mirrored = np.pad(image, pad, mode="symmetric")
        for name in ("dilation", "erosion", "closing", "opening", "black_tophat"):
            theirs = getattr(sk, name)(mirrored, footprint)[pad:-pad, pad:-pad]
            mine = getattr(ours, name)(image, ours.disk(radius))
            assert mine.dtype == theirs.dtype, name
            assert np.array_equal(mine, theirs), name


def test_a_symmetric_footprint_that_is_not_a_disk_goes_to_scipy() -> None:
    image = np.random.default_rng(1).random((30, 40))
    ring = sk.disk(3).astype(bool) & ~np.pad(sk.disk(1), 2).astype(bool)
    for footprint in (np.array([[1, 0, 1]], bool), ring):
        assert ours._rows(footprint) is None
        assert np.array_equal(ours.dilation(image, footprint), sk.dilation(image, footprint))
        assert np.array_equal(ours.erosion(image, footprint), sk.erosion(image, footprint))


@pytest.mark.parametrize("max_size", [0, 1, 5, 40, 400])
@pytest.mark.parametrize("connectivity", [1, 2])
def test_remove_small_objects_and_holes(max_size: int, connectivity: int) -> None:
    for mask in _masks():
        theirs = sk.remove_small_objects(mask, max_size=max_size, connectivity=connectivity)
        mine = ours.remove_small_objects(mask, max_size=max_size, connectivity=connectivity)
        assert np.array_equal(mine, theirs) and not np.shares_memory(mine, mask)
        theirs = sk.remove_small_holes(mask, max_size=max_size, connectivity=connectivity)
        mine = ours.remove_small_holes(mask, max_size=max_size, connectivity=connectivity)
        assert np.array_equal(mine, theirs)
        assert mine.sum() >= mask.sum() >= ours.remove_small_objects(mask, max_size=max_size).sum()


@pytest.mark.parametrize("mode", ["thick", "inner"])
def test_find_boundaries(mode: str) -> None:
    thin = [np.array([[True, False, True, True]]), np.array([[True], [False]]), np.ones((1, 1), bool)]
    for mask in [*_masks(), *thin, np.zeros((5, 6), bool)]:
        assert np.array_equal(ours.find_boundaries(mask, mode), find_boundaries(mask, mode=mode))
    with pytest.raises(ValueError, match="mode"):
        ours.find_boundaries(_masks()[0], "outer")


@pytest.mark.parametrize("connectivity", [1, 2])
def test_label(connectivity: int) -> None:
    for mask in _masks():
        theirs = label(mask, connectivity=connectivity)
        mine = ours.label(mask, connectivity)
        assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)


def test_small_disks_row_by_row_match_scipy_binary_morphology() -> None:
    """Radii up to 4, whole or not, dilate and erode row by row (issue 41): the same pixels as scipy's
    binary_dilation and binary_erosion (outside the image: mask) with the disk x^2 + y^2 <= r^2 they
    replaced, on empty, full and edge-touching masks."""
    masks = [*_masks(), np.ones((11, 13), bool), np.pad(np.ones((3, 3), bool), ((0, 5), (0, 7)))]
    for mask in masks:
        for r in (1, 1.5, 2, 2.5, 3, 3.7, 4):
            footprint = ours._disk(r)
            grown = ndimage.binary_dilation(mask, structure=footprint) if mask.any() else mask
            assert np.array_equal(ours.dilate_disk(mask, r), grown), r
            shrunk = ndimage.binary_erosion(mask, structure=footprint, border_value=1) if mask.any() else mask
            assert np.array_equal(ours.erode_disk(mask, r), shrunk), r


@pytest.mark.parametrize("block", [1, 3, 8])
def test_dilation_on_blocks_is_the_exact_one_within_two_blocks(block: int) -> None:
    """`dilate_disk_on_blocks` (dust's distance to tissue, a stroke's reach): within two blocks (a
    block's own width either side, diagonally) of the exact dilation, either way; exact on 1 px blocks."""
    rng = np.random.default_rng(7)
    mask = np.zeros((203, 157), bool)
    mask[rng.integers(0, 203, 6), rng.integers(0, 157, 6)] = True
    mask[40:60, 90:95] = True
    r = 21.5
    near = ours.dilate_disk_on_blocks(mask, r, block)
    assert near.shape == mask.shape
    slack = 2 * block * np.sqrt(2) if block > 1 else 0.0
    assert not (ours.dilate_disk(mask, r - slack) & ~near).any()
    assert not (near & ~ours.dilate_disk(mask, r + slack)).any()
    if block == 1:
        assert np.array_equal(near, ours.dilate_disk(mask, r))

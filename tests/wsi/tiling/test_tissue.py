"""Tissue mask on arrays: saturated stain is tissue, glass and specks are not, holes are filled."""

from __future__ import annotations

import numpy as np
import pytest

from wsi.core.config import parse_config
from wsi.core.errors import ConfigError
from wsi.tiling.params import TissueParams
from wsi.tiling.tissue import cell_fractions, saturation, tissue_mask

GLASS = (243, 243, 245)
PINK = (226, 150, 190)


def _thumb(h: int = 200, w: int = 300, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = np.empty((h, w, 3), np.float32)
    img[:] = GLASS
    img[40:160, 30:150] = PINK  # a 120 x 120 px fragment
    img += rng.normal(0, 3, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def test_saturation_matches_hsv_definition() -> None:
    rgb = np.array([[[255, 0, 0], [128, 128, 128], [200, 100, 50], [0, 0, 0]]], np.uint8)
    np.testing.assert_allclose(saturation(rgb)[0], [1.0, 0.0, 0.75, 0.0], atol=1e-6)


def test_mask_finds_fragment_and_not_glass() -> None:
    mask = tissue_mask(_thumb(), mpp=8.0)
    assert mask[50:150, 40:140].mean() > 0.99
    assert mask[:, 170:].sum() == 0
    assert mask[:30].sum() == 0


def test_blank_slide_has_no_tissue() -> None:
    blank = np.clip(np.random.default_rng(1).normal(243, 2, (100, 100, 3)), 0, 255).astype(np.uint8)
    assert tissue_mask(blank, mpp=8.0).sum() == 0


def test_small_specks_removed_and_holes_filled() -> None:
    img = _thumb()
    img[100:104, 250:254] = PINK  # 4 x 4 px at 8 um/px = 1,024 um^2 < min_region_um2
    img[90:100, 80:90] = GLASS  # 10 x 10 px hole = 6,400 um^2 < max_hole_um2
    mask = tissue_mask(img, mpp=8.0)
    assert mask[100:104, 250:254].sum() == 0
    assert mask[90:100, 80:90].all()
    # with hole filling off, the hole stays open
    kept_hole = tissue_mask(img, mpp=8.0, params=TissueParams(max_hole_um2=0, closing_um=0))
    assert not kept_hole[93:97, 83:87].any()


def test_sizes_are_physical() -> None:
    """The same scene at half the thumbnail resolution gives the same mask (up to resampling)."""
    img = _thumb(400, 600)
    img[100:104, 500:504] = PINK  # 4 px at 4 um/px = 256 um^2: a speck at either resolution
    fine = tissue_mask(img, mpp=4.0)
    coarse = tissue_mask(img[::2, ::2], mpp=8.0)
    assert np.mean(fine[::2, ::2] == coarse) > 0.99
    assert fine[100:104, 500:504].sum() == 0


def test_cell_fractions_exact_on_boxes() -> None:
    mask = np.zeros((10, 10), bool)
    mask[0:5, 0:5] = True
    boxes = np.array([[0, 0, 5, 5], [0, 0, 10, 10], [5, 5, 10, 10], [2.5, 0, 7.5, 5]], float)
    np.testing.assert_allclose(cell_fractions(mask, boxes), [1.0, 0.25, 0.0, 0.5], atol=0.11)


def test_bad_params_rejected() -> None:
    with pytest.raises(ValueError, match="thumb_mpp"):
        TissueParams(thumb_mpp=0)
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        tissue_mask(np.zeros((10, 10), np.uint8), mpp=8.0)


def test_params_from_a_mapping_refuse_unknown_keys() -> None:
    """The tissue settings parse through wsi.core.config like every config: a typo is named, not ignored."""
    with pytest.raises(ConfigError, match=r"tile\.json: unknown field 'closing'"):
        parse_config(TissueParams, {"closing": 16.0}, source="tile.json")
    assert parse_config(TissueParams, {"thumb_mpp": 4}, source="tile.json") == TissueParams(thumb_mpp=4.0)
    assert parse_config(TissueParams, TissueParams().to_dict(), source="tile.json") == TissueParams()


def test_dark_background_mask_finds_what_shines() -> None:
    """Fluorescence-like: a dim green fragment with bright blue dots on black is tissue; the saturation
    mask of H&E would see every saturated speck and nothing of what makes a fragment."""
    rng = np.random.default_rng(3)
    img = np.full((200, 300, 3), 6, np.float32)
    img[40:160, 30:150, 1] = 60 + rng.normal(0, 8, (120, 120))  # dim FITC-like tissue
    img[rng.integers(40, 160, 60), rng.integers(30, 150, 60), 2] = 220  # sparse DAPI-like nuclei
    thumb = np.clip(img + rng.normal(0, 2, img.shape), 0, 255).astype(np.uint8)
    mask = tissue_mask(thumb, mpp=8.0, dark=True)
    assert mask[50:150, 40:140].mean() > 0.98 and mask[:, 170:].mean() == 0.0
    assert not tissue_mask(np.full((100, 100, 3), 8, np.uint8), mpp=8.0, dark=True).any()  # blank: none


def _otsu_mask_before(rgb: np.ndarray, params: TissueParams) -> np.ndarray:
    """The saturation split as it was computed pixel by pixel (issue 35's reference)."""
    from skimage.filters import threshold_otsu

    sat = saturation(rgb)
    usable = np.asarray(rgb.max(axis=-1)) > params.dark_level
    values = sat[usable]
    threshold = params.min_saturation
    if values.size and float(values.max()) > float(values.min()):
        threshold = max(threshold, float(threshold_otsu(values)))
    return (sat > threshold) & usable


@pytest.mark.parametrize("case", ["fragment", "noise", "flat", "two values", "dark", "pale", "real"])
def test_saturation_split_by_channel_pairs_matches_pixel_by_pixel(case: str, shared_data) -> None:
    """`_saturated_pixels` builds Otsu's histogram from (brightest, darkest) channel pair counts: the
    same mask as the per-pixel computation on any image (issue 35)."""
    from wsi.slides.slide import open_slide
    from wsi.slides.thumbnail import read_thumbnails
    from wsi.tiling.tissue import _saturated_pixels

    rng = np.random.default_rng(7)
    images = {
        "fragment": [_thumb()],
        "noise": [rng.integers(0, 256, (120, 130, 3), dtype=np.uint8)],
        "flat": [np.full((30, 40, 3), 240, np.uint8)],
        "two values": [np.where(rng.random((30, 40, 1)) < 0.5, 240, 120).repeat(3, axis=2).astype(np.uint8)],
        "dark": [rng.integers(0, 40, (50, 60, 3), dtype=np.uint8)],  # mostly under dark_level
        "pale": [np.clip(rng.normal(235, 6, (80, 90, 3)), 0, 255).astype(np.uint8)],
    }
    if case == "real":
        images["real"] = []
        for name in ("CMU-1-Small-Region.svs", "tcga-cr-7395-01a-01-ts1.svs"):  # the TCGA crop has no mpp
            with open_slide(shared_data / "slides" / name, mpp=0.25) as slide:
                [thumb] = read_thumbnails(slide, (4.0,))
                images["real"].append(thumb.image)
    for params in (TissueParams(), TissueParams(min_saturation=0.0, dark_level=0)):
        for rgb in images[case]:
            np.testing.assert_array_equal(_saturated_pixels(rgb, params), _otsu_mask_before(rgb, params))

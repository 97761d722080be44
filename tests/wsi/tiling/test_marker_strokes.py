"""Marker told from tissue by more than its colour: brown marker and yellow dye as strokes (never DAB),
translucent grey marker as a long band, red by its size, its stroke's shape and the slide's own eosin,
and blood left alone unless the `blood` filter is asked for. Real images of benchmarks/images (their
tuning split: SOURCES.tsv) and, where no public image holds the case, marker painted on a real slide's
thumbnail with measured optical densities."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from wsi.tiling.artifacts import BLOOD, INK, ArtifactParams, colour_code, find_artifacts, ink
from wsi.tiling.artifacts.colour import hsv, optical_density
from wsi.tiling.artifacts.ink import ink_colour_regions
from wsi.tiling.params import DEFAULT_FILTERS, TileParams
from wsi.tiling.tissue import tissue_mask

REPO = Path(__file__).resolve().parents[3]
IMAGES = REPO / "benchmarks" / "images"
sys.path.insert(0, str(REPO / "benchmarks"))
import artifact_accuracy as bench  # noqa: E402

PARAMS = TileParams(tile_px=64)


def _case(stem: str) -> bench.Case:
    [case] = [c for c in bench.public_cases() if c.path.stem == stem]
    assert case.split == "tune"  # tests may look at tuning images only
    return case


def _colours(rgb: np.ndarray, mpp: float, params: ArtifactParams | None = None) -> np.ndarray:
    """The ink colour map of an image taken as a thumbnail at `mpp` (no block reduction)."""
    planes = hsv(rgb.astype(np.float32))
    return ink_colour_regions(planes, optical_density(rgb), mpp=mpp, params=params or ArtifactParams())


def test_brown_marker_loops_are_ink_named_brown() -> None:
    """Ink-WSI's breast slide (tuning half): brown marker loops over pale stroma are rejected as ink and
    named brown; the stroma inside the loops is kept."""
    s = bench.score(_case("vr_breast_brown-blue"), PARAMS)
    inked, _, kept = s.by_colour["brown"]
    assert inked > 500 and kept <= 0.06 * inked  # 92% of them were kept when brown was no ink
    assert sum(s.false.values()) <= 0.02 * s.clean
    rgb = np.asarray(Image.open(IMAGES / "vr_breast_brown-blue.png").convert("RGB"))
    brown = bench.marker_truth(rgb, {"brown"})["brown"]
    colours = _colours(rgb, 45.0)
    assert (colours[brown] == colour_code("brown")).mean() > 0.8


def test_grey_marker_band_is_ink() -> None:
    """MSKCC thumbnail 00169: a translucent grey-purple marker line (the colour of dense nuclei) drawn
    across the section is ink as a long band."""
    s = bench.score(_case("mskcc_thumbnail_00169"), PARAMS)
    assert s.as_ink >= 0.9 * s.inked, (s.as_ink, s.inked)  # 82% without the band rule
    assert sum(s.false.values()) <= 0.01 * s.clean


def test_brown_grey_tissue_is_no_grey_marker() -> None:
    """tissue_masker_lite's lavender sections hold brown-grey wedges as dark as grey marker: only a grey
    of a purple-to-blue hue (or neutral) can be a grey marker band, so they are kept."""
    s = bench.score(_case("tml_lavender_blue-marker"), PARAMS)
    assert sum(s.false.values()) <= 2, s.false  # 47 tiles when any dark low-saturation band was ink
    assert s.as_ink >= 0.95 * s.inked


def test_specks_of_eosin_in_a_jpeg_thumbnail_are_no_red_marker() -> None:
    """A TUPAC thumbnail (a screenshot): single pixels of vivid eosin reach a red marker's optical-density
    ratio by noise; a red region needs a few dense pixels to be judged, so none is red ink."""
    case = _case("dh_tupac_teal-ring_blue")
    rgb = np.asarray(Image.open(case.path).convert("RGB"))
    assert not (_colours(rgb, case.mpp) == colour_code("red")).any()
    s = bench.score(case, PARAMS)
    assert s.false.get("ink", 0) <= 6, s.false


def test_red_grows_no_further_than_its_stroke_toward_the_slides_eosin(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HistoQC's red pen over tissue (a hand-drawn mask): a stroke's faint streaks join it only while
    they absorb more like the stroke than like the slide's eosin, so little red ink lies outside the
    mask (99 pixels more than 100 um outside it when growth followed the hue alone). The growth is
    measured alone; with the faint ends on a stroke's line (`stroke_ends`, tested in test_stroke_ends)
    88 pixels more lie outside the mask: on the faint red line that continues two strokes over tissue
    and that the hand-drawn mask leaves out (seen on an overlay)."""
    base = shared_data / "artifacts" / "histoqc" / "pen_markings_he__pen_red"
    rgb = np.asarray(Image.open(f"{base}.png").convert("RGB"))
    truth = np.asarray(Image.open(f"{base}_mask.png").convert("L")) > 127
    far = ~ndimage.binary_dilation(truth, iterations=3)
    red = _colours(rgb, 30.0) == colour_code("red")
    assert (red & truth).sum() >= 0.9 * truth.sum()  # 0.91 by the growth alone
    assert (red & far).sum() <= 160
    monkeypatch.setattr(ink, "continued_red", lambda strokes, *_: strokes)
    red = _colours(rgb, 30.0) == colour_code("red")
    assert (red & truth).sum() >= 0.85 * truth.sum()
    assert (red & far).sum() <= 60


# ------------------------------------------------------------------------------ painted on a real slide
def _aorta(shared_data: Path) -> np.ndarray:
    """OpenSlide's aorta thumbnail (8.7 um/px; its eosin: OD_R / OD_G 0.21-0.28)."""
    path = shared_data / "artifacts" / "lookalikes" / "neg02_histolab_openslide_JP2K-33003-1_aorta_thumb.png"
    return np.asarray(Image.open(path).convert("RGB")).copy()


def _paint(rgb: np.ndarray, where: np.ndarray, od: tuple[float, float, float], seed: int = 0) -> None:
    """Paint `where` with optical densities `od` (R, G, B), 3 grey levels of noise."""
    noise = np.random.default_rng(seed).normal(0, 3, (int(where.sum()), 3))
    px = 255.0 * 10.0 ** (-np.asarray(od)) + noise
    rgb[where] = np.clip(px, 0, 255).astype(np.uint8)


def _tissue_spot(rgb: np.ndarray) -> tuple[int, int, int]:
    """(row, column, radius): the centre of the largest disk of tissue and its radius (px)."""
    depth = ndimage.distance_transform_edt(tissue_mask(rgb, mpp=8.7))
    y, x = np.unravel_index(int(depth.argmax()), depth.shape)
    return int(y), int(x), int(depth.max())


#: a red that absorbs as blood on a haemorrhagic TCGA slide did (OD_R / OD_G 0.16), deep red (hue 350)
BLOOD_LIKE = (0.13, 0.8, 0.6)


def test_a_pool_of_marker_red_is_no_ink_but_a_stroke_of_it_is(shared_data: Path) -> None:
    """Red that absorbs like haemorrhage can (0.16, under the 0.19 limit) is ink only as a stroke: a band
    0.4 mm wide and 4 mm long is, a pool 0.8 mm across is not."""
    rgb = _aorta(shared_data)
    y, x, radius = _tissue_spot(rgb)
    assert radius >= 45
    yy, xx = np.mgrid[: rgb.shape[0], : rgb.shape[1]]
    pool = (yy - y) ** 2 + (xx - x) ** 2 <= 45**2  # 0.8 mm across at 8.7 um/px, on the tissue
    _paint(rgb, pool, BLOOD_LIKE)
    band = np.zeros(rgb.shape[:2], bool)
    band[40:86, 60:520] = True  # 0.4 x 4 mm, over glass and tissue
    _paint(rgb, band, BLOOD_LIKE, seed=1)
    colours = _colours(rgb, 8.7)
    red = colours == colour_code("red")
    assert red[band].mean() > 0.9
    assert red[pool].mean() < 0.05


def test_red_absorbing_more_than_the_slides_own_eosin_is_no_marker(shared_data: Path) -> None:
    """On a slide whose eosin absorbs little red light (the aorta with its red OD halved: eosin 0.10-0.14),
    a red band at 0.16 absorbs more red light than the stain itself: not a marker, whatever its shape."""
    rgb = _aorta(shared_data)
    od = -np.log10(np.maximum(rgb.astype(np.float32), 1.0) / 255.0)
    od[..., 0] *= 0.5
    rgb = np.clip(255.0 * 10.0 ** (-od), 0, 255).astype(np.uint8)
    band = np.zeros(rgb.shape[:2], bool)
    band[40:86, 60:520] = True
    _paint(rgb, band, BLOOD_LIKE)
    assert not (_colours(rgb, 8.7) == colour_code("red")).any()


def _over_the_wall(
    rgb: np.ndarray, add: np.ndarray | tuple[float, ...], rows: int = 35
) -> tuple[np.ndarray, np.ndarray]:
    """(the aorta with optical density `add` added over a band `rows` px wide (35: 0.3 mm) and 3.5 mm
    long lying on its wall, the band)."""
    band = np.zeros(rgb.shape[:2], bool)
    band[700 : 700 + rows, 250:650] = True
    od = optical_density(rgb)
    od[band] += np.asarray(add, np.float32) if isinstance(add, tuple) else add[band]
    return np.clip(255.0 * 10.0 ** (-od), 0, 255).astype(np.uint8), band


def test_translucent_grey_marker_over_tissue_is_ink_but_a_fold_is_not(shared_data: Path) -> None:
    """A translucent grey marker line over the aorta's pink wall takes the tissue's colour (saturation
    0.4, more than any grey on glass) but adds a grey optical density: black ink. A fold along the same
    band (the wall's own density added again) adds the tissue's colour: not ink."""
    grey, band = _over_the_wall(_aorta(shared_data), (0.3, 0.3, 0.27))
    assert np.median(hsv(grey[band].astype(np.float32))[1]) > 0.35
    assert (_colours(grey, 8.7)[band] == colour_code("black")).mean() > 0.8  # 0 without the grey excess
    rgb = _aorta(shared_data)
    fold, band = _over_the_wall(rgb, optical_density(rgb))
    assert not _colours(fold, 8.7)[band].any()


def test_a_fine_grey_marker_line_over_tissue_is_ink(shared_data: Path) -> None:
    """A finer grey line (0.17 mm wide, finer than a band of dark grey must be to count) over the aorta's
    wall: what it adds is grey, which no tissue adds, so it is ink as it is (not without
    strokes.GREY_EXCESS_BAND)."""
    grey, band = _over_the_wall(_aorta(shared_data), (0.3, 0.3, 0.27), rows=20)
    assert (_colours(grey, 8.7)[band] == colour_code("black")).mean() > 0.8


def test_eosin_rich_tissue_beside_a_red_stroke_is_not_taken_with_it() -> None:
    """A red marker stroke along a section's edge, touching a patch of eosin-rich tissue as red as itself
    (hue 344, saturation 0.65) that absorbs red light like the slide's own eosin (OD_R / OD_G 0.235; the
    slide's eosin 0.22-0.32): the stroke is ink, the patch is not (93% of it was, taken with the stroke
    as one region and then grown into)."""
    rng = np.random.default_rng(0)
    rgb = np.full((200, 300, 3), 245, np.uint8)
    tissue = np.zeros((200, 300), bool)
    tissue[60:200, 20:280] = True
    n = int(tissue.sum())
    ratio = np.clip(rng.normal(0.32, 0.08, n), 0.12, 0.6)  # eosin, hue ~320
    od = np.stack([ratio * 0.6, np.full(n, 0.6), np.full(n, 0.3)], 1)
    rgb[tissue] = np.clip(255 * 10 ** (-od) + rng.normal(0, 2, od.shape), 0, 255).astype(np.uint8)
    stroke = np.zeros_like(tissue)
    stroke[30:60, 20:280] = True  # 0.5 mm wide, 4 mm long at 16 um/px
    _paint(rgb, stroke, (0.09, 0.85, 0.7))
    patch = np.zeros_like(tissue)
    patch[60:100, 100:180] = True
    _paint(rgb, patch, (0.235 * 0.6, 0.6, 0.42), seed=2)
    red = _colours(rgb, 16.0) == colour_code("red")
    assert red[stroke].mean() > 0.95
    assert red[patch].mean() < 0.1


def test_a_red_strokes_streaks_over_tissue_follow_it_across_their_gaps() -> None:
    """A red stroke on glass runs on over a section as a drying marker does: parallel faint streaks
    (saturation 0.48, OD_R / OD_G 0.23, under the slide's eosin: 0.25-0.34) a gap apart, the nearest
    40 um from the stroke's end and the furthest 850 um. They are ink all along (none of them touches
    the stroke: 0 without bridging the gaps; 70% when growth stopped 600 um from the stroke), the tissue
    beside them is not."""
    rng = np.random.default_rng(0)
    rgb = np.full((200, 300, 3), 245, np.uint8)
    tissue = np.zeros((200, 300), bool)
    tissue[20:200, 152:290] = True
    n = int(tissue.sum())
    ratio = np.clip(rng.normal(0.34, 0.05, n), 0.12, 0.6)
    od = np.stack([ratio * 0.45, np.full(n, 0.45), np.full(n, 0.22)], 1)
    rgb[tissue] = np.clip(255 * 10 ** (-od) + rng.normal(0, 2, od.shape), 0, 255).astype(np.uint8)
    stroke = np.zeros_like(tissue)
    stroke[40:70, 10:150] = True  # at 16 um/px: 0.5 mm wide, on glass, ending 2 px from the tissue
    _paint(rgb, stroke, (0.09, 0.85, 0.7))
    streaks = np.zeros_like(tissue)
    for y in range(40, 70, 5):
        streaks[y : y + 3, 152:205] = True
    _paint(rgb, streaks, (0.085, 0.37, 0.25), seed=3)
    red = _colours(rgb, 16.0) == colour_code("red")
    assert red[stroke].mean() > 0.95
    assert red[streaks].mean() > 0.85
    assert not red[100:, 152:].any()


def test_a_dark_band_of_nuclei_is_no_grey_marker_but_an_even_grey_band_is() -> None:
    """Two dark purple-grey bands 0.4 mm wide and 4 mm long (value 0.5 and 0.4, saturation 0.29 and
    0.11): one absorbs little blue light, as haematoxylin does (OD 0.42, 0.45, 0.30: dense tumour
    nuclei), the other absorbs all three colours alike (0.45, 0.45, 0.40: a grey marker). Only the
    marker is ink (both were, as long bands of the grey marker's colour)."""
    rgb = np.full((240, 400, 3), 245, np.uint8)
    nuclei = np.zeros(rgb.shape[:2], bool)
    nuclei[40:65, 50:350] = True  # at 16 um/px
    marker = np.zeros_like(nuclei)
    marker[150:175, 50:350] = True
    _paint(rgb, nuclei, (0.42, 0.45, 0.30))
    _paint(rgb, marker, (0.45, 0.45, 0.40), seed=1)
    colours = _colours(rgb, 16.0)
    assert not colours[nuclei].any()
    assert (colours[marker] == colour_code("black")).mean() > 0.9


#: yellow tissue-marking dye: absorbs blue light almost only (hue ~50 degrees)
YELLOW_DYE = (0.03, 0.1, 0.9)


def test_yellow_dye_along_a_margin_is_ink_named_yellow_but_a_speck_is_not(shared_data: Path) -> None:
    """Yellow dye painted along a margin (a band 0.2 mm wide, 3 mm long) is ink, named yellow; a speck of
    the same colour (pigment) is not."""
    rgb = _aorta(shared_data)
    y, x, _ = _tissue_spot(rgb)
    band = np.zeros(rgb.shape[:2], bool)
    band[y : y + 23, x - 150 : x + 200] = True
    speck = np.zeros_like(band)
    speck[y - 40 : y - 32, x : x + 8] = True
    _paint(rgb, band | speck, YELLOW_DYE)
    colours = _colours(rgb, 8.7)
    assert (colours[band] == colour_code("yellow")).mean() > 0.9
    assert not colours[speck].any()
    without = _colours(rgb, 8.7, ArtifactParams(ink_colours=("green", "blue", "red", "brown", "black")))
    assert not without[band].any()  # the colours looked for are a setting


def test_ink_colours_setting_names_only_known_colours() -> None:
    with pytest.raises(ValueError, match="unknown ink colour"):
        ArtifactParams(ink_colours=("purple",))


# ------------------------------------------------------------------------------ blood
def test_blood_is_tissue_by_default_and_its_own_reason_when_asked_for() -> None:
    """MSKCC thumbnail 00006 (a clot and blood-filled vessels, black marker): by default no filter takes
    the blood; with the blood filter on, tiles that are mostly blood are rejected as blood, never as ink,
    and the marker's tiles stay ink."""
    case = _case("mskcc_thumbnail_00006")
    rgb = np.asarray(Image.open(case.path).convert("RGB"))
    _, default, _, _ = bench.judge(rgb, case.mpp, PARAMS)
    assert "blood" not in DEFAULT_FILTERS and not (default == BLOOD).any()
    asked = TileParams(tile_px=64, artifacts=ArtifactParams(filters=(*DEFAULT_FILTERS, "blood")))
    _, reasons, _, _ = bench.judge(rgb, case.mpp, asked)
    assert (reasons == BLOOD).sum() >= 5
    assert ((reasons == INK) == (default == INK)).all()  # the marker's verdicts are the same
    maps = find_artifacts(rgb, tissue_mask(rgb, mpp=case.mpp), mpp=case.mpp, params=asked.artifacts)
    assert not (maps.masks["blood"] & maps.masks["ink"]).any()

"""Heatmap pictures: a large thumbnail is drawn from a box-filtered copy at the PNG's scale, the tiles
land where they are on the slide, the colour goes on tissue only (glass keeps its pixels), tissue left
out is told apart from a tile near 0, probabilities are never rounded to certainty, and the colour bar
says what a value means."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import wsi.pipelines.inputs.heatmaps as heatmaps
from wsi.pipelines.inputs.heatmaps import _CANVAS_PX, _fit, heatmap_image, probability_text, render_heatmap


def test_a_large_thumbnail_is_box_filtered_to_the_canvas_with_its_um_per_px() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (1536, 2048, 3), dtype=np.uint8)
    small, mpp = _fit(image, 2.0, _CANVAS_PX)
    assert small.shape == (768, 1024, 3) and small.dtype == np.uint8 and mpp == 4.0
    block = image[:2, :2].reshape(-1, 3).mean(axis=0)  # the first output pixel: the mean of its 2 x 2 block
    assert np.abs(small[0, 0].astype(float) - block).max() <= 1.0
    same, same_mpp = _fit(image[:512, :700], 2.0, _CANVAS_PX)
    assert same.shape == (512, 700, 3) and same_mpp == 2.0  # small enough already: untouched


def test_tiles_land_where_they_are_on_a_large_thumbnail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a 4,000 x 2,000 um slide whose thumbnail is 2,000 px wide: a tile against the class (blue) at
    x 600 um and two towards it (red) at x 1,800 (same height) and 3,000 (lower down). In the PNG the
    three keep the slide's geometry: equal steps from left to right, the first two level, the third lower
    by as much as the slide says (1,200 um down = 1,200 um across)."""
    thumb = _tissue_on_glass((1000, 2000), (50, 150, 950, 1950))  # the tiles lie on the tissue
    out = tmp_path / "h.png"
    fitted: list[tuple[int, ...]] = []

    def spy(image: np.ndarray, mpp: float, longest: int) -> tuple[np.ndarray, float]:
        small, small_mpp = _fit(image, mpp, longest)
        fitted.append(small.shape)
        return small, small_mpp

    monkeypatch.setattr(heatmaps, "_fit", spy)
    coords = np.array([[600.0, 200.0], [1800.0, 200.0], [3000.0, 1400.0]])
    render_heatmap(
        coords_um=coords, tile_um=256.0, values=np.array([-1.0, 1.0, 1.0]), out_png=out, thumbnail=thumb,
        thumb_mpp=2.0,
    )  # fmt: skip
    assert fitted == [(512, 1024, 3)]  # drawn from the thumbnail at the PNG's scale, not all 2,000 px
    png = np.asarray(Image.open(out).convert("RGB")).astype(int)
    red = png[..., 0] - png[..., 2] > 30  # blended half way over lilac tissue: reddish and bluish
    blue = png[..., 2] - png[..., 0] > 30
    bar = np.where((red | blue).sum(axis=1) > png.shape[1] * 0.2)[0]  # the colour bar (under the map)
    red[int(bar.min()) :] = blue[int(bar.min()) :] = False
    ys, xs = np.nonzero(red)
    upper = ys < ys.min() + (ys.max() - ys.min()) / 2
    (by, bx) = np.argwhere(blue).mean(axis=0)
    r1y, r1x = ys[upper].mean(), xs[upper].mean()
    r2y, r2x = ys[~upper].mean(), xs[~upper].mean()
    step = r1x - bx
    assert step > 20 and abs((r2x - r1x) - step) < 2  # equal steps across
    assert abs(r1y - by) < 1.5 and abs((r2y - r1y) - step) < 2  # level, then as far down as across
    side = np.sqrt(blue.sum())  # a square tile of 256 um: 256 / 1200 of a step
    assert abs(side / step - 256 / 1200) < 0.03


def _tissue_on_glass(shape: tuple[int, int], box: tuple[int, int, int, int], seed: int = 0) -> np.ndarray:
    """A thumbnail: glass (243) with a block of lilac, textured tissue at rows y0:y1, columns x0:x1."""
    rng = np.random.default_rng(seed)
    thumb = np.full((*shape, 3), 243, dtype=np.uint8)
    y0, x0, y1, x1 = box
    texture = rng.integers(-25, 25, (y1 - y0, x1 - x0, 1))
    thumb[y0:y1, x0:x1] = np.clip(np.array([175, 140, 190]) + texture, 0, 255).astype(np.uint8)
    return thumb


def test_glass_stays_uncoloured_and_left_out_tissue_is_not_a_zero() -> None:
    """One tile half on tissue, half on glass (value +1), one on glass only (-1), one on tissue at 0;
    tissue under no tile is left out. Glass keeps the thumbnail's pixels, even inside a tile; the tissue
    under the +1 tile turns red; the 0 tile keeps the tissue's colours nearly; left-out tissue is grey."""
    thumb = _tissue_on_glass((400, 800), (0, 0, 400, 400))  # tissue: the left half; glass: the right
    coords = np.array([[350.0, 100.0], [600.0, 100.0], [100.0, 250.0]])  # um at 1 um/px; 100 um tiles
    drawn = heatmap_image(coords_um=coords, tile_um=100.0, values=np.array([1.0, -1.0, 0.0]),
                          thumbnail=thumb, thumb_mpp=1.0)  # fmt: skip
    x0, y0 = drawn.offset_px
    image = np.round(drawn.image * 255).astype(int)
    source = thumb[y0 : y0 + image.shape[0], x0 : x0 + image.shape[1]].astype(int)
    assert drawn.tissue is not None
    glass = ~drawn.tissue
    assert glass.sum() > 10_000 and (image[glass] == source[glass]).all()  # not one glass pixel coloured
    on_glass = (slice(100 - y0, 200 - y0), slice(600 - x0, 700 - x0))  # the -1 tile: glass only
    assert (image[on_glass] == source[on_glass]).all()
    half = image[100 - y0 : 200 - y0, 355 - x0 : 395 - x0]  # the +1 tile's tissue half: red
    assert (half[..., 0] - half[..., 2]).mean() > 40
    zero = image[255 - y0 : 345 - y0, 105 - x0 : 195 - x0]  # the 0 tile: the tissue's colours, paler
    left = image[20 - y0 : 80 - y0, 20 - x0 : 80 - x0]  # tissue under no tile: grey, hatched
    tissue_rgb = source[20 - y0 : 80 - y0, 20 - x0 : 80 - x0]
    assert np.abs(zero.mean(axis=(0, 1)) - (tissue_rgb.mean(axis=(0, 1)) + 247) / 2).max() < 6
    spread = lambda px: (px.max(axis=-1) - px.min(axis=-1)).mean()  # noqa: E731 - colourfulness
    assert spread(left) < 3 < spread(zero) and drawn.left_out
    assert drawn.scored.sum() == 50 * 100 + 100 * 100  # two tiles' tissue, not the glass under them


def test_a_real_slides_glass_is_left_as_it_is(shared_data: Path) -> None:
    """CMU-1-Small-Region (real H&E) with a value on every 128 um cell: near-white glass pixels of the
    slide keep their colour (at most a few at the tissue's edge change), the tissue under tiles does not."""
    from wsi.slides.slide import open_slide
    from wsi.slides.thumbnail import read_thumbnail

    with open_slide(shared_data / "slides" / "CMU-1-Small-Region.svs") as slide:
        thumb = read_thumbnail(slide, 2.0).image
        w_um, h_um = (d * slide.mpp for d in slide.dimensions)
    mpp = w_um / thumb.shape[1]
    xs, ys = np.meshgrid(np.arange(0, w_um - 128, 128.0), np.arange(0, h_um - 128, 128.0))
    coords = np.stack([xs.ravel(), ys.ravel()], axis=1)
    values = np.random.default_rng(1).standard_normal(len(coords))
    drawn = heatmap_image(coords_um=coords, tile_um=128.0, values=values, thumbnail=thumb, thumb_mpp=mpp)
    x0, y0 = drawn.offset_px
    image = np.round(drawn.image * 255).astype(int)
    source = thumb[y0 : y0 + image.shape[0], x0 : x0 + image.shape[1]].astype(int)
    changed = (image != source).any(axis=-1)
    glass = source.min(axis=-1) >= 225  # near-white: glass (and the palest lumen)
    assert glass.sum() > 0.2 * glass.size
    assert changed[glass].mean() < 0.05, changed[glass].mean()  # before: every pixel under a tile
    stained = source.max(axis=-1) - source.min(axis=-1) > 60
    assert changed[stained].mean() > 0.9


def test_probabilities_are_never_rounded_to_certainty() -> None:
    assert probability_text(0.99993) == "p>0.999" and probability_text(4e-5) == "p<0.001"
    assert probability_text(0.6125) == "p=0.613" and probability_text(1.0) == "p=1"
    assert probability_text(float("nan")) == "p n/a"


def test_the_colour_bar_says_what_a_value_means(tmp_path: Path) -> None:
    """For two classes: the log-odds, both directions, and that the values and the model's constant add
    up to it (models/attribution.py); a categorical title shows p>0.999, not p=1.000."""
    from wsi.pipelines.inputs.heatmaps import RISK_SCALE, class_scale
    from wsi.pipelines.study.kinds import build_kind
    from wsi.pipelines.study.tasks import load_task

    kind = build_kind(load_task("nsclc-subtype"))
    output = np.array([0.99993, 0.00007])
    [(suffix, _, title)] = kind.heatmap_maps(np.zeros((3, 2)), output)
    assert title == "LUAD (p>0.999)"
    scale = kind.heatmap_scale(suffix, output)
    assert scale == class_scale("LUAD", ["LUAD", "LUSC"])
    assert "log-odds of LUAD against LUSC (logit units)" in scale and "blue towards LUSC" in scale
    assert "add up to the log-odds" in scale
    assert "against the mean of the other classes" in class_scale("a", ["a", "b", "c"])
    assert build_kind(load_task("nsclc-os")).heatmap_scale("", np.array([0.3])) == RISK_SCALE

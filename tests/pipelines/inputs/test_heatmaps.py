"""Heatmap pictures: a large thumbnail is drawn from a box-filtered copy at the PNG's scale, and the
tiles land where they are on the slide."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import wsi.pipelines.inputs.heatmaps as heatmaps
from wsi.pipelines.inputs.heatmaps import _CANVAS_PX, _fit, render_heatmap


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
    thumb = np.full((1000, 2000, 3), 255, dtype=np.uint8)
    out = tmp_path / "h.png"
    fitted: list[tuple[int, ...]] = []

    def spy(image: np.ndarray, mpp: float, longest: int) -> tuple[np.ndarray, float]:
        small, small_mpp = _fit(image, mpp, longest)
        fitted.append(small.shape)
        return small, small_mpp

    monkeypatch.setattr(heatmaps, "_fit", spy)
    coords = np.array([[600.0, 200.0], [1800.0, 200.0], [3000.0, 1400.0]])
    render_heatmap(
        coords_um=coords, tile_size_um=256.0, values=np.array([-1.0, 1.0, 1.0]), out_png=out, thumbnail=thumb,
        thumb_mpp=2.0,
    )  # fmt: skip
    assert fitted == [(512, 1024, 3)]  # drawn from the thumbnail at the PNG's scale, not all 2,000 px
    png = np.asarray(Image.open(out).convert("RGB")).astype(int)
    red = png[..., 0] - png[..., 2] > 30  # blended 0.6 over white: reddish and bluish
    blue = png[..., 2] - png[..., 0] > 30
    bar = np.where((red | blue).sum(axis=0) > png.shape[0] * 0.2)[0]  # the colour bar holds both colours
    red[:, int(bar.min()) :] = blue[:, int(bar.min()) :] = False
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

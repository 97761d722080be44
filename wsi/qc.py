"""QC image: the slide at a legible size with the tissue outline and every tissue tile coloured by its fate,
under a title (slide id, mpp, tile size) and a legend with the count of each fate.

One glance tells whether the mask found the tissue and whether the filters threw away good tiles: kept
tiles are green, mostly-background ones blue, blurry ones red, undecodable ones magenta, and the tissue
outline is yellow; grid cells outside the tissue are counted in the legend but not drawn. The map sits
at the top-left corner at `scale` pixels per level-0 pixel, so a tile at level-0 (x, y) is drawn at
(x * sx, y * sy); the legend panel lies below it.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from skimage.segmentation import find_boundaries

from wsi.errors import SlideError
from wsi.files import atomic_path
from wsi.tiling import BACKGROUND, BLURRY, KEPT, UNREADABLE, TileParams, TissueGrid

if TYPE_CHECKING:
    from wsi.slide import Slide

log = logging.getLogger(__name__)

KEPT_RGB = (0, 170, 0)
BACKGROUND_RGB = (30, 90, 230)
BLURRY_RGB = (220, 30, 30)
UNREADABLE_RGB = (200, 0, 200)
OUTLINE_RGB = (255, 210, 0)
#: colour of each fate, in the order tiles are drawn (kept last: on top where boxes touch)
FATE_RGB: dict[str, tuple[int, int, int]] = {
    "background": BACKGROUND_RGB,
    "blurry": BLURRY_RGB,
    "unreadable": UNREADABLE_RGB,
    "kept": KEPT_RGB,
}
#: the long side of the map, pixels: legible on a screen and in a report (smaller slides: their own size)
QC_LONG_SIDE_PX = 1200
_FILL_ALPHA = 0.25
#: the legend panel is at least this wide, so its text fits however narrow the slide
_MIN_WIDTH_PX = 760
_FONT_PX = 20
_PAD_PX = 10
_TEXT_RGB = (20, 20, 20)
_Font = ImageFont.FreeTypeFont | ImageFont.ImageFont
_Item = tuple[str, tuple[int, int, int] | None]  # legend text, swatch colour (None: no swatch)


@dataclass(frozen=True)
class QcLegend:
    """What the panel under the map says."""

    title: str  # first line, e.g. the slide id
    subtitle: str  # second line, e.g. "mpp 0.499 um/px (metadata) | tiles 256 um at 256 px"
    counts: Mapping[str, int]  # fate -> number of tiles; "outside tissue" for grid cells not drawn


def tile_qc_image(
    slide: Slide,
    found: TissueGrid,
    reasons: np.ndarray,
    *,
    slide_id: str,
    mpp_source: str,
    params: TileParams,
) -> np.ndarray:
    """The tile stage's QC picture of one slide: the slide at `qc_size` (QC_LONG_SIDE_PX on its long
    side, its own size where smaller), each candidate tile coloured by its reason code in `reasons`
    (`wsi.tiling` KEPT, BACKGROUND, BLURRY, UNREADABLE), a legend with the counts, the id and the mpp."""
    w0, h0 = slide.dimensions
    thumb = _qc_thumbnail(slide, found, qc_size((w0, h0)), slide_id)
    coords = found.candidate_coords
    fates = {"kept": KEPT, "background": BACKGROUND, "blurry": BLURRY, "unreadable": UNREADABLE}
    counts = {name: int((reasons == code).sum()) for name, code in fates.items()}
    counts["outside tissue"] = len(found.grid) - len(found.candidates)
    legend = QcLegend(
        title=slide_id,
        subtitle=(
            f"mpp {slide.mpp:.4g} um/px ({mpp_source})  |  tiles {params.tile_um:g} um at {params.tile_px} px"
            f"  |  {found.background.kind} background  |  {len(found.grid):,} grid cells"
        ),
        counts=counts,
    )
    return render_qc(
        thumb,
        found.mask,
        scale=(thumb.shape[1] / w0, thumb.shape[0] / h0),
        step_px=found.grid.step_px,
        tiles={name: coords[reasons == code] for name, code in fates.items()},
        legend=legend,
    )


def _qc_thumbnail(slide: Slide, found: TissueGrid, size: tuple[int, int], slide_id: str) -> np.ndarray:
    """The slide at `size` (w, h): the tissue thumbnail where that is as large, else a finer read; the
    tissue thumbnail enlarged where that read fails (a QC picture never costs a slide its tiles)."""
    if size[0] <= found.thumb.shape[1]:
        return found.thumb
    try:
        return slide.thumbnail_at(slide.dimensions[0] * slide.mpp / size[0])
    except SlideError as exc:
        log.warning("%s: QC picture drawn from the coarser tissue thumbnail (%s)", slide_id, exc)
        return np.asarray(Image.fromarray(found.thumb).resize(size, Image.Resampling.BILINEAR))


def render_qc(
    thumb: np.ndarray,
    mask: np.ndarray,
    *,
    scale: tuple[float, float],
    step_px: float,
    tiles: Mapping[str, np.ndarray],
    legend: QcLegend | None = None,
) -> np.ndarray:
    """(H, W, 3) uint8 QC image: the map (the thumbnail, its size) on top, the legend panel below.

    thumb: (h, w, 3) uint8; mask: tissue mask, any size (resized to the thumbnail); scale: thumbnail
    pixels per level-0 pixel (sx, sy); step_px: tile side in level-0 pixels; tiles: fate (a key of
    FATE_RGB) -> (N, 2) level-0 top-left coordinates. Without `legend` only the map is returned.
    """
    img = np.ascontiguousarray(thumb[..., :3], dtype=np.uint8).copy()  # (h, w, 3); blended box by box
    h, w = img.shape[:2]
    sx, sy = scale
    line = 2 if step_px * min(sx, sy) >= 24 else 1  # thicker outlines where boxes are big enough
    for fate, rgb in FATE_RGB.items():
        colour = np.asarray(rgb, np.float32)
        for x, y in np.asarray(tiles.get(fate, ()), dtype=np.float64).reshape(-1, 2).tolist():
            x0, y0 = round(x * sx), round(y * sy)
            x1, y1 = round((x + step_px) * sx), round((y + step_px) * sy)
            x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(max(x1, x0 + 1), w), min(max(y1, y0 + 1), h)
            if x0 >= x1 or y0 >= y1:
                continue
            box = img[y0:y1, x0:x1]
            box[:] = np.clip(box * (1 - _FILL_ALPHA) + _FILL_ALPHA * colour + 0.5, 0, 255).astype(np.uint8)
            box[:line, :] = box[-line:, :] = rgb  # outline, so neighbouring tiles stay apart
            box[:, :line] = box[:, -line:] = rgb
    if mask.shape != (h, w):
        resized = Image.fromarray(mask.astype(np.uint8) * 255).resize((w, h), Image.Resampling.NEAREST)
        mask = np.asarray(resized) > 0
    img[find_boundaries(mask, mode="thick" if line > 1 else "inner")] = OUTLINE_RGB
    picture = img
    return picture if legend is None else _with_legend(picture, legend)


def qc_size(level0_size: tuple[int, int], long_side_px: int = QC_LONG_SIDE_PX) -> tuple[int, int]:
    """(w, h) of the map for a slide of `level0_size` px: QC_LONG_SIDE_PX on the long side, or the
    slide's own size where it is smaller."""
    w0, h0 = level0_size
    f = min(1.0, long_side_px / max(w0, h0, 1))
    return max(1, round(w0 * f)), max(1, round(h0 * f))


@functools.cache
def _font(size: int) -> _Font:
    try:
        return ImageFont.load_default(size=size)  # Pillow's bundled scalable font (needs FreeType)
    except (OSError, ValueError, TypeError):
        return ImageFont.load_default()


def _legend_items(counts: Mapping[str, int]) -> list[_Item]:
    items: list[_Item] = []
    for fate in ("kept", "background", "blurry", "unreadable"):
        items.append((f"{fate} {counts.get(fate, 0):,}", FATE_RGB[fate]))
    items.append((f"outside tissue {counts.get('outside tissue', 0):,} (not drawn)", None))
    items.append(("tissue outline", OUTLINE_RGB))
    return items


def _with_legend(picture: np.ndarray, legend: QcLegend) -> np.ndarray:
    """The map on a white canvas with the title, subtitle and legend written under it."""
    h, w = picture.shape[:2]
    big, small = _font(_FONT_PX + 4), _font(_FONT_PX)
    width = max(w, _MIN_WIDTH_PX)
    rows = _layout(_legend_items(legend.counts), small, width)
    line_h = _FONT_PX + 10
    panel_h = _PAD_PX + (line_h + 4) + line_h + len(rows) * line_h + _PAD_PX
    canvas = Image.new("RGB", (width, h + panel_h), (255, 255, 255))
    canvas.paste(Image.fromarray(picture), (0, 0))
    draw = ImageDraw.Draw(canvas)
    y = h + _PAD_PX
    draw.text((_PAD_PX, y), legend.title, fill=_TEXT_RGB, font=big)
    y += line_h + 4
    draw.text((_PAD_PX, y), legend.subtitle, fill=_TEXT_RGB, font=small)
    y += line_h
    sw = _FONT_PX - 4  # swatch side
    for row in rows:
        for x, text, rgb in row:
            if rgb is not None:
                draw.rectangle((x, y + 3, x + sw, y + 3 + sw), fill=rgb, outline=_TEXT_RGB)
            draw.text((x + sw + 6, y), text, fill=_TEXT_RGB, font=small)
        y += line_h
    return np.asarray(canvas)


def _layout(
    items: Sequence[_Item], font: _Font, width: int
) -> list[list[tuple[int, str, tuple[int, int, int] | None]]]:
    """Legend items left to right, wrapped into rows that fit `width`: (x, text, swatch colour)."""
    rows: list[list[tuple[int, str, tuple[int, int, int] | None]]] = [[]]
    x = _PAD_PX
    for text, rgb in items:
        item_w = _FONT_PX + 2 + int(font.getlength(text)) + 24
        if rows[-1] and x + item_w > width - _PAD_PX:
            rows.append([])
            x = _PAD_PX
        rows[-1].append((x, text, rgb))
        x += item_w
    return rows


def save_png(path: str | os.PathLike[str], image: np.ndarray) -> None:
    """Write an RGB uint8 image as PNG atomically."""
    with atomic_path(Path(path)) as tmp:
        Image.fromarray(image).save(tmp, format="PNG", compress_level=1)  # faster than 6, ~6% larger

"""The QC picture's palette and the panel under its map: the title with a scale bar, the subtitle, the
one count of what was and was not considered, the legend (a key per fate, drawn as the map draws it:
a bare outline, a filled square, dashes) and the notes.

The palette is Okabe & Ito's, which stays distinct for colour-blind readers (Okabe, Ito 2008, "Color
Universal Design"; Wong 2011, Nature Methods 8:441); `wsi.tiling.qc` draws the map with it and the tile
stage's QuPath classes (`qc/<id>.geojson`) and `wsi view` use the same colours.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# Okabe & Ito's colour-blind-safe palette (see the module docstring); the greys of what could not be
# decoded and the dashed outline are the marks outside it
KEPT_RGB = (0, 158, 115)  # bluish green: an outline only
BACKGROUND_RGB = (86, 180, 233)  # sky blue: mostly glass
BLURRY_RGB = (230, 159, 0)  # orange
#: hatching over what could not be decoded (slate-grey stripes: "no data", not glass; not a neutral
#: grey, which anti-aliased text also makes)
UNKNOWN_RGB = (95, 105, 120)
#: unreadable tiles: a dark grey border over that hatching (their pixels are the "no data" it shows)
UNREADABLE_RGB = (64, 64, 64)
#: the artifact filters (`wsi.tiling.artifacts`): colours apart from the ones above
ARTIFACT_RGB: dict[str, tuple[int, int, int]] = {
    "ink": (0, 114, 178),  # blue
    "fold": (213, 94, 0),  # vermillion
    "bubble": (240, 228, 66),  # yellow
    "border": (0, 0, 0),  # black
    "dust": (204, 121, 167),  # reddish purple
}
#: the tissue outline: dashes of these two colours (QuPath's "Tissue" class takes the first)
OUTLINE_RGB = (0, 0, 0)
OUTLINE_DASH_RGB = (255, 255, 255)
#: legend key of the count of undecodable regions on the tissue thumbnail
UNKNOWN_KEY = "undecodable regions"
#: colour of each fate, in the order tiles are drawn (kept first: a rejected tile's border wins a shared edge)
FATE_RGB: dict[str, tuple[int, int, int]] = {
    "kept": KEPT_RGB,
    "background": BACKGROUND_RGB,
    "blurry": BLURRY_RGB,
    "unreadable": UNREADABLE_RGB,
    **ARTIFACT_RGB,
    # tiles an artifact segmentation network rejected (`wsi.pipelines.tile.segment`), by GrandQC's classes,
    # in the colour of the weight-free filter of the same meaning
    "artifact: fold": ARTIFACT_RGB["fold"],
    "artifact: dark_spot": ARTIFACT_RGB["dust"],
    "artifact: pen": ARTIFACT_RGB["ink"],
    "artifact: edge_bubble": ARTIFACT_RGB["bubble"],
    "artifact: out_of_focus": BLURRY_RGB,
}
#: fates drawn as an outline only: kept (the tissue shows as it is), unreadable (the hatching shows)
OUTLINED = ("kept", "unreadable")
#: what the legend calls a fate where its code name would mislead ("background" is a tile on the tissue
#: grid that is mostly glass, not the glass around the tissue, which is "no tissue")
FATE_LABELS = {"background": "mostly glass"}
#: the legend panel is at least this wide, so its text fits however narrow the slide
_MIN_WIDTH_PX = 760
_FONT_PX = 20
_PAD_PX = 10
_TEXT_RGB = (20, 20, 20)
_Font = ImageFont.FreeTypeFont | ImageFont.ImageFont
#: legend text, swatch colour (None: no swatch), swatch kind ("fill", "outline", "dash")
_Item = tuple[str, tuple[int, int, int] | None, str]


@dataclass(frozen=True)
class QcLegend:
    """What the panel under the map says."""

    title: str  # first line, e.g. the slide id
    subtitle: str  # second line, e.g. "mpp 0.499 um/px (metadata) | tiles 256 um at 256 px"
    counts: Mapping[str, int]  # fate -> number of tiles; "outside tissue" for grid cells not drawn;
    # UNKNOWN_KEY: undecodable regions of the tissue thumbnail (an item only when there are some)
    notes: tuple[str, ...] = ()  # lines under the legend, e.g. where the slide could not be decoded


@functools.cache
def _font(size: int) -> _Font:
    try:
        return ImageFont.load_default(size=size)  # Pillow's bundled scalable font (needs FreeType)
    except (OSError, ValueError, TypeError):
        return ImageFont.load_default()


def _legend_items(counts: Mapping[str, int]) -> list[_Item]:
    items: list[_Item] = []
    for fate in ("kept", "background", "blurry", "unreadable", *ARTIFACT_RGB):
        kind = "outline" if fate in OUTLINED else "fill"
        items.append((f"{FATE_LABELS.get(fate, fate)} {counts.get(fate, 0):,}", FATE_RGB[fate], kind))
    for fate, n in counts.items():
        if fate.startswith("artifact: ") and fate in FATE_RGB:
            items.append((f"{fate} {n:,}", FATE_RGB[fate], "fill"))
    items.append(("tissue outline", OUTLINE_RGB, "dash"))
    if counts.get(UNKNOWN_KEY):
        items.append((f"{UNKNOWN_KEY} {counts[UNKNOWN_KEY]:,} (hatched)", UNKNOWN_RGB, "fill"))
    return items


def considered_line(counts: Mapping[str, int]) -> str:
    """The one count of what was looked at and what was not: grid cells on tissue (kept or rejected by
    a filter) and grid cells without tissue, which no filter saw."""
    judged = {k: n for k, n in counts.items() if k in FATE_RGB}
    kept = judged.get("kept", 0)
    outside = counts.get("outside tissue", 0)
    total = sum(judged.values()) + outside
    return (
        f"{total:,} grid cells: {total - outside:,} with tissue were judged ({kept:,} kept, "
        f"{total - outside - kept:,} rejected, by reason below); {outside:,} without tissue were not "
        "considered (not drawn)"
    )


def _scale_bar(um_per_px: float, longest_px: int) -> tuple[int, str]:
    """(length in map pixels, label) of the longest round length (1, 2 or 5 x 10^k um) that fits
    `longest_px`."""
    best = (0, "")
    for exponent in range(0, 7):
        for step in (1, 2, 5):
            um = step * 10**exponent
            px = round(um / um_per_px)
            if 0 < px <= longest_px:
                best = (px, f"{um // 1000:g} mm" if um >= 1000 else f"{um:g} um")
    return best


def with_legend(picture: np.ndarray, legend: QcLegend, um_per_px: float | None = None) -> np.ndarray:
    """The map on a white canvas with the title, a scale bar, the subtitle, the count of what was and
    was not considered and the legend written under it."""
    h, w = picture.shape[:2]
    big, small = _font(_FONT_PX + 4), _font(_FONT_PX)
    width = max(w, _MIN_WIDTH_PX)
    rows = _layout(_legend_items(legend.counts), small, width)
    considered = _wrap(considered_line(legend.counts), small, width - 2 * _PAD_PX)
    notes = [part for note in legend.notes for part in _wrap(note, small, width - 2 * _PAD_PX)]
    line_h = _FONT_PX + 10
    n_lines = len(considered) + len(rows) + len(notes)
    panel_h = _PAD_PX + (line_h + 4) + line_h + n_lines * line_h + _PAD_PX
    canvas = Image.new("RGB", (width, h + panel_h), (255, 255, 255))
    canvas.paste(Image.fromarray(picture), (0, 0))
    draw = ImageDraw.Draw(canvas)
    y = h + _PAD_PX
    draw.text((_PAD_PX, y), legend.title, fill=_TEXT_RGB, font=big)
    if um_per_px:  # right-aligned on the title's line, at the map's scale
        title_w = int(big.getlength(legend.title)) + 3 * _PAD_PX
        bar, label = _scale_bar(um_per_px, min(w // 4, width - title_w - 140))
        if bar:
            x1 = width - _PAD_PX - int(small.getlength(label)) - 8
            draw.rectangle((x1 - bar, y + 10, x1, y + 15), fill=_TEXT_RGB)
            draw.rectangle((x1 - bar, y + 5, x1 - bar + 1, y + 20), fill=_TEXT_RGB)
            draw.rectangle((x1 - 1, y + 5, x1, y + 20), fill=_TEXT_RGB)
            draw.text((x1 + 6, y + 2), label, fill=_TEXT_RGB, font=small)
    y += line_h + 4
    draw.text((_PAD_PX, y), legend.subtitle, fill=_TEXT_RGB, font=small)
    y += line_h
    for part in considered:
        draw.text((_PAD_PX, y), part, fill=_TEXT_RGB, font=small)
        y += line_h
    sw = _FONT_PX - 4  # swatch side
    for row in rows:
        for x, text, rgb, kind in row:
            if rgb is not None:
                _swatch(draw, (x, y + 3, x + sw, y + 3 + sw), rgb, kind)
            draw.text((x + sw + 6, y), text, fill=_TEXT_RGB, font=small)
        y += line_h
    for note in notes:
        draw.text((_PAD_PX, y), note, fill=_TEXT_RGB, font=small)
        y += line_h
    return np.asarray(canvas)


def _swatch(
    draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], rgb: tuple[int, int, int], kind: str
) -> None:
    """A legend key drawn as the map draws its mark: a filled square, a bare outline, or dashes."""
    x0, y0, x1, y1 = box
    if kind == "fill":
        draw.rectangle(box, fill=rgb, outline=_TEXT_RGB)
    elif kind == "outline":
        draw.rectangle(box, outline=rgb, width=3)
    else:  # the tissue outline's black and white dashes, on a light grey ground
        draw.rectangle(box, fill=(200, 200, 200))
        for i, x in enumerate(range(x0, x1, 3)):
            draw.line((x, (y0 + y1) // 2, min(x + 2, x1), (y0 + y1) // 2), width=3,
                      fill=OUTLINE_RGB if i % 2 == 0 else OUTLINE_DASH_RGB)  # fmt: skip


def _wrap(text: str, font: _Font, width: int) -> list[str]:
    """`text` cut at spaces into lines that fit `width` pixels (a single long word keeps its line)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and font.getlength(f"{lines[-1]} {word}") <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def _layout(
    items: Sequence[_Item], font: _Font, width: int
) -> list[list[tuple[int, str, tuple[int, int, int] | None, str]]]:
    """Legend items left to right, wrapped into rows that fit `width`: (x, text, swatch colour, kind)."""
    rows: list[list[tuple[int, str, tuple[int, int, int] | None, str]]] = [[]]
    x = _PAD_PX
    for text, rgb, kind in items:
        item_w = _FONT_PX + 2 + int(font.getlength(text)) + 24
        if rows[-1] and x + item_w > width - _PAD_PX:
            rows.append([])
            x = _PAD_PX
        rows[-1].append((x, text, rgb, kind))
        x += item_w
    return rows


__all__ = [
    "ARTIFACT_RGB", "BACKGROUND_RGB", "BLURRY_RGB", "FATE_LABELS", "FATE_RGB", "KEPT_RGB", "OUTLINED",
    "OUTLINE_DASH_RGB", "OUTLINE_RGB", "UNKNOWN_KEY", "UNKNOWN_RGB", "UNREADABLE_RGB", "QcLegend",
    "considered_line", "with_legend",
]  # fmt: skip

"""QC image: the slide at a legible size with the tissue outline and every tissue tile coloured by its fate,
under a title (slide id, mpp, tile size) and a legend with the count of each fate.

One glance tells whether the mask found the tissue and whether the filters threw away good tiles: kept
tiles are green, mostly-background ones blue, blurry ones red, undecodable ones magenta, the artifacts
(`wsi.tiling.artifacts`) ink orange, folds brown, bubbles/coverslip edges cyan, out-of-scan borders near-black
and dust pink (every reason is in the legend, with its count, even at 0), the tissue outline yellow;
grid cells outside the tissue are counted in the legend but not drawn. Parts of the slide that could
not be decoded are hatched grey, counted in the legend and named (level-0 px) under it.
The map sits at the top-left corner at `scale` pixels per level-0 pixel, so a tile at level-0 (x, y) is
drawn at (x * sx, y * sy); the legend panel lies below it.

The QC never reads the slide: the tile stage reads the picture with the tissue thumbnail
(`wsi.slides.thumbnail.read_thumbnails`, at `qc_picture_mpp`), so each level is read, and each undecodable
region reported, once.
"""

from __future__ import annotations

import functools
import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from wsi.core.files import atomic_path
from wsi.slides.tiff_tiles import UnreadableRegion, describe_regions, distinct_regions
from wsi.tiling.grid import REASON_NAMES, TissueGrid
from wsi.tiling.morphology import find_boundaries
from wsi.tiling.params import TileParams

if TYPE_CHECKING:
    from wsi.slides.slide import Slide
    from wsi.slides.thumbnail import Thumbnail

KEPT_RGB = (0, 170, 0)
BACKGROUND_RGB = (30, 90, 230)
BLURRY_RGB = (220, 30, 30)
UNREADABLE_RGB = (200, 0, 200)
#: the artifact filters (`wsi.tiling.artifacts`): colours apart from the four above and the outline
ARTIFACT_RGB: dict[str, tuple[int, int, int]] = {
    "ink": (255, 130, 0),  # orange
    "fold": (130, 70, 20),  # brown
    "bubble": (0, 190, 220),  # cyan
    "border": (40, 40, 40),  # near black
    "dust": (255, 110, 180),  # pink
}
OUTLINE_RGB = (255, 210, 0)
#: hatching over what could not be decoded (slate-grey stripes: "no data", not glass; not a neutral
#: grey, which anti-aliased text also makes)
UNKNOWN_RGB = (95, 105, 120)
#: legend key of the count of undecodable regions on the tissue thumbnail
UNKNOWN_KEY = "undecodable regions"
#: colour of each fate, in the order tiles are drawn (kept last: on top where boxes touch)
FATE_RGB: dict[str, tuple[int, int, int]] = {
    "background": BACKGROUND_RGB,
    "blurry": BLURRY_RGB,
    "unreadable": UNREADABLE_RGB,
    **ARTIFACT_RGB,
    # tiles an artifact segmentation network rejected (`wsi.pipelines.tile.segment`), by GrandQC's classes
    "artifact: fold": (255, 140, 0),
    "artifact: dark_spot": (40, 40, 40),
    "artifact: pen": (0, 190, 190),
    "artifact: edge_bubble": (150, 90, 30),
    "artifact: out_of_focus": (120, 60, 200),
    "kept": KEPT_RGB,
}
#: the long side of the map, pixels: legible on a screen and in a report (smaller slides: their own size)
QC_LONG_SIDE_PX = 1200
_FILL_ALPHA = 0.25  # `_blend` computes it in integers: change both together
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
    counts: Mapping[str, int]  # fate -> number of tiles; "outside tissue" for grid cells not drawn;
    # UNKNOWN_KEY: undecodable regions of the tissue thumbnail (an item only when there are some)
    notes: tuple[str, ...] = ()  # lines under the legend, e.g. where the slide could not be decoded


def qc_picture_mpp(level0_size: tuple[int, int], mpp: float, thumb_mpp: float) -> float | None:
    """um/px of the QC map of a slide (`qc_size`) when it is finer than the tissue thumbnail at
    `thumb_mpp`, i.e. worth reading with it; None when the tissue thumbnail serves."""
    qc_mpp = level0_size[0] * mpp / qc_size(level0_size)[0]
    return qc_mpp if qc_mpp < thumb_mpp else None


def tile_qc_image(
    slide: Slide,
    found: TissueGrid,
    reasons: np.ndarray,
    *,
    slide_id: str,
    mpp_source: str,
    params: TileParams,
    picture: Thumbnail | None = None,
    unreadable: Sequence[UnreadableRegion] = (),
    extra_fates: Mapping[str, int] | None = None,
) -> np.ndarray:
    """The tile stage's QC picture of one slide: the slide at `qc_size` (QC_LONG_SIDE_PX on its long
    side, its own size where smaller), each candidate tile coloured by its reason code in `reasons`
    (`wsi.tiling.grid.REASON_NAMES`: kept, background, blurry, unreadable and the artifacts), a legend with
    the counts, the id and the mpp.

    picture: the slide read at `qc_picture_mpp` (else the tissue thumbnail, enlarged where smaller);
    unreadable: undecodable regions found besides the thumbnail's (by the tile reads), named under the
    legend with the thumbnail's. extra_fates: more reason codes by name (a key of FATE_RGB), e.g. the
    artifact network's ("artifact: pen")."""
    w0, h0 = slide.dimensions
    thumb, unknown = _qc_thumbnail(found, picture, qc_size((w0, h0)))
    coords = found.candidate_coords
    fates = {name: code for code, name in REASON_NAMES.items()}
    fates.update(extra_fates or {})
    counts = {name: int((reasons == code).sum()) for name, code in fates.items()}
    counts["outside tissue"] = len(found.grid) - len(found.candidates)
    regions = distinct_regions(found.unreadable, picture.unreadable if picture else (), unreadable)
    if found.unreadable:
        counts[UNKNOWN_KEY] = len(found.unreadable)
    legend = QcLegend(
        title=slide_id,
        subtitle=(
            f"mpp {slide.mpp:.4g} um/px ({mpp_source})  |  tiles {params.tile_um:g} um at {params.tile_px} px"
            f"  |  {found.background.kind} background  |  {len(found.grid):,} grid cells"
        ),
        counts=counts,
        notes=(f"cannot be decoded: {describe_regions(regions)}",) if regions else (),
    )
    return render_qc(
        thumb,
        found.mask,
        scale=(thumb.shape[1] / w0, thumb.shape[0] / h0),
        step_px=found.grid.step_px,
        tiles={name: coords[reasons == code] for name, code in fates.items()},
        legend=legend,
        unknown=unknown,
    )


def _qc_thumbnail(
    found: TissueGrid, picture: Thumbnail | None, size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray | None]:
    """The map's image and its unknown mask (None: all read): the picture read for the QC, else the
    tissue thumbnail, enlarged to `size` where smaller (a QC picture never reads the slide again)."""
    if picture is not None:
        return picture.image, picture.unknown if picture.unknown.any() else None
    if size[0] <= found.thumb.shape[1]:
        return found.thumb, found.unknown
    image = np.asarray(Image.fromarray(found.thumb).resize(size, Image.Resampling.BILINEAR))
    if found.unknown is None:
        return image, None
    mask = Image.fromarray(found.unknown.astype(np.uint8) * 255).resize(size, Image.Resampling.NEAREST)
    return image, np.asarray(mask) > 0


def render_qc(
    thumb: np.ndarray,
    mask: np.ndarray,
    *,
    scale: tuple[float, float],
    step_px: float,
    tiles: Mapping[str, np.ndarray],
    legend: QcLegend | None = None,
    unknown: np.ndarray | None = None,
) -> np.ndarray:
    """(H, W, 3) uint8 QC image: the map (the thumbnail, its size) on top, the legend panel below.

    thumb: (h, w, 3) uint8; mask: tissue mask, any size (resized to the thumbnail); scale: thumbnail
    pixels per level-0 pixel (sx, sy); step_px: tile side in level-0 pixels; tiles: fate (a key of
    FATE_RGB) -> (N, 2) level-0 top-left coordinates; unknown: (h, w) bool, what could not be decoded
    (hatched). Without `legend` only the map is returned.
    """
    img = np.ascontiguousarray(thumb[..., :3], dtype=np.uint8).copy()  # (h, w, 3); blended box by box
    h, w = img.shape[:2]
    if unknown is not None and unknown.shape == (h, w):
        rows, cols = np.nonzero(unknown)
        stripe = (rows + cols) // 4 % 2 == 0  # diagonal hatching, 4 px stripes
        img[rows[stripe], cols[stripe]] = UNKNOWN_RGB
    sx, sy = scale
    line = 2 if step_px * min(sx, sy) >= 24 else 1  # thicker outlines where boxes are big enough
    for fate, rgb in FATE_RGB.items():
        colour = np.asarray(rgb, np.uint16) + 2
        for x, y in np.asarray(tiles.get(fate, ()), dtype=np.float64).reshape(-1, 2).tolist():
            x0, y0 = round(x * sx), round(y * sy)
            x1, y1 = round((x + step_px) * sx), round((y + step_px) * sy)
            x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(max(x1, x0 + 1), w), min(max(y1, y0 + 1), h)
            if x0 >= x1 or y0 >= y1:
                continue
            box = img[y0:y1, x0:x1]
            box[:] = _blend(box, colour)
            box[:line, :] = box[-line:, :] = rgb  # outline, so neighbouring tiles stay apart
            box[:, :line] = box[:, -line:] = rgb
    if mask.shape != (h, w):
        resized = Image.fromarray(mask.astype(np.uint8) * 255).resize((w, h), Image.Resampling.NEAREST)
        mask = np.asarray(resized) > 0
    img[find_boundaries(mask, "thick" if line > 1 else "inner")] = OUTLINE_RGB
    picture = img
    return picture if legend is None else _with_legend(picture, legend)


def _blend(box: np.ndarray, colour_plus_2: np.ndarray) -> np.ndarray:
    """`box` blended with a colour at _FILL_ALPHA = 1/4, rounded: v * 3/4 + c / 4 + 1/2, floored, is
    (3v + c + 2) >> 2 exactly (the float form it replaced, clipped, gives the same bytes: tested), in a
    third fewer numpy calls per box (a 10 mm slide draws 869)."""
    out = box.astype(np.uint16)
    out *= 3
    out += colour_plus_2
    out >>= 2
    return out


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
    for fate in ("kept", "background", "blurry", "unreadable", *ARTIFACT_RGB):
        items.append((f"{fate} {counts.get(fate, 0):,}", FATE_RGB[fate]))
    for fate, n in counts.items():
        if fate.startswith("artifact: ") and fate in FATE_RGB:
            items.append((f"{fate} {n:,}", FATE_RGB[fate]))
    items.append((f"outside tissue {counts.get('outside tissue', 0):,} (not drawn)", None))
    items.append(("tissue outline", OUTLINE_RGB))
    if counts.get(UNKNOWN_KEY):
        items.append((f"{UNKNOWN_KEY} {counts[UNKNOWN_KEY]:,} (hatched)", UNKNOWN_RGB))
    return items


def _with_legend(picture: np.ndarray, legend: QcLegend) -> np.ndarray:
    """The map on a white canvas with the title, subtitle and legend written under it."""
    h, w = picture.shape[:2]
    big, small = _font(_FONT_PX + 4), _font(_FONT_PX)
    width = max(w, _MIN_WIDTH_PX)
    rows = _layout(_legend_items(legend.counts), small, width)
    notes = [part for note in legend.notes for part in _wrap(note, small, width - 2 * _PAD_PX)]
    line_h = _FONT_PX + 10
    panel_h = _PAD_PX + (line_h + 4) + line_h + (len(rows) + len(notes)) * line_h + _PAD_PX
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
    for note in notes:
        draw.text((_PAD_PX, y), note, fill=_TEXT_RGB, font=small)
        y += line_h
    return np.asarray(canvas)


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
    """Write an RGB uint8 image as PNG atomically (`png_bytes`)."""
    data = png_bytes(image)
    with atomic_path(Path(path)) as tmp:
        tmp.write_bytes(data)


def png_bytes(image: np.ndarray) -> bytes:
    """An (H, W, 3) uint8 image as a PNG file: every row with the Up filter, compressed by libdeflate at
    level 1 (imagecodecs). A 1,250 x 1,394 QC picture: 42 ms of CPU against 80 for libpng's zlib at level
    1 with the same filter (itself half of Pillow's time), for ~6% more bytes; the pixels read back the
    same. Where imagecodecs lacks libdeflate, libpng writes it."""
    import imagecodecs  # already loaded by the slide reader (tifffile's JPEG decoder)

    image = np.ascontiguousarray(image, dtype=np.uint8)
    if image.ndim != 3 or image.shape[2] != 3 or not image.size:
        raise ValueError(f"expected a non-empty (H, W, 3) uint8 image, got shape {image.shape}")
    if not imagecodecs.DEFLATE.available:
        return bytes(imagecodecs.png_encode(image, level=1, filter=imagecodecs.PNG.FILTER.UP))
    h, w = image.shape[:2]
    flat = image.reshape(h, w * 3)
    rows = np.empty((h, 1 + w * 3), np.uint8)  # each row: its filter type, then the filtered bytes
    rows[:, 0] = 2  # Up: the byte minus the one above it (modulo 256); the first row's "above" is 0
    rows[0, 1:] = flat[0]
    np.subtract(flat[1:], flat[:-1], out=rows[1:, 1:])
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8 bits, truecolour, deflate, no interlace
    # zlib-wrapped, as PNG's IDAT wants; imagecodecs reads any buffer (its stub names bytes only)
    idat = bytes(imagecodecs.deflate_encode(cast(bytes, rows), level=1))
    return b"".join([_PNG_SIGNATURE, _chunk(b"IHDR", ihdr), _chunk(b"IDAT", idat), _chunk(b"IEND", b"")])


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, body: bytes) -> bytes:
    """A PNG chunk: length, type, data, CRC-32 of type and data."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(body, zlib.crc32(kind)))

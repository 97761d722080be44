"""QC image: the slide at a legible size with the tissue outline and every tissue tile marked by its fate,
under a title (slide id, mpp, tile size, a scale bar) and a legend with the count of each fate.

One glance tells whether the mask found the tissue and whether the filters threw away good tiles, and the
tissue keeps its own colours to judge that by: kept tiles are thin outlines only (no fill over the H&E),
each rejected tile is filled, half transparent, in its reason's colour with a border of it, in Okabe &
Ito's palette, which stays distinct for colour-blind readers (`wsi.tiling.qc_legend`: kept bluish green,
mostly glass sky blue, blurry orange, the artifacts (`wsi.tiling.artifacts`) ink blue, folds vermillion,
bubbles/coverslip edges yellow, out-of-scan borders black and dust reddish purple). Every reason is in
the legend, with its count, even at 0. The tissue outline is a dashed black-and-white line that reads on
glass and on stain alike.
Grid cells without tissue were not considered: one count says how many, and they are not drawn. Parts of
the slide that could not be decoded are hatched slate grey (unreadable tiles: a dark grey border over
the hatching), counted in the legend and named (level-0 px) under it.
The map sits at the top-left corner at `scale` pixels per level-0 pixel, so a tile at level-0 (x, y) is
drawn at (x * sx, y * sy); the legend panel lies below it, and nothing is drawn over the map but the
tile marks and the outline (the scale bar is in the panel).

The QC never reads the slide: the tile stage reads the picture with the tissue thumbnail
(`wsi.slides.thumbnail.read_thumbnails`, at `qc_picture_mpp`), so each level is read, and each undecodable
region reported, once.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
from PIL import Image

from wsi.core.files import atomic_path
from wsi.slides.tiff_tiles import UnreadableRegion, describe_regions, distinct_regions
from wsi.tiling.grid import REASON_NAMES, TissueGrid
from wsi.tiling.morphology import find_boundaries
from wsi.tiling.params import TileParams
from wsi.tiling.qc_legend import (
    ARTIFACT_RGB,
    BACKGROUND_RGB,
    BLURRY_RGB,
    FATE_RGB,
    KEPT_RGB,
    OUTLINE_DASH_RGB,
    OUTLINE_RGB,
    OUTLINED,
    UNKNOWN_KEY,
    UNKNOWN_RGB,
    UNREADABLE_RGB,
    QcLegend,
    with_legend,
)

if TYPE_CHECKING:
    from wsi.slides.slide import Slide
    from wsi.slides.thumbnail import Thumbnail

#: the long side of the map, pixels: legible on a screen and in a report (smaller slides: their own size)
QC_LONG_SIDE_PX = 1200
_FILL_ALPHA = 0.5  # `_blend` computes it in integers: change both together


def qc_picture_mpp(level0_size: tuple[int, int], mpp: float, thumb_mpp: float) -> float | None:
    """um/px of the QC map of a slide (`qc_size`) when it is finer than the tissue thumbnail at
    `thumb_mpp`, i.e. worth reading with it; None when the tissue thumbnail serves."""
    qc_mpp = level0_size[0] * mpp / qc_size(level0_size)[0]
    return qc_mpp if qc_mpp < thumb_mpp else None


@dataclass(frozen=True)
class QcExtras:
    """What the tile reads and an artifact network add to the QC picture beyond the tissue grid.

    picture: the slide read at `qc_picture_mpp` (else the tissue thumbnail, enlarged where smaller);
    unreadable: undecodable regions found besides the thumbnail's (by the tile reads), named under the
    legend with the thumbnail's. extra_fates: more reason codes by name (a key of FATE_RGB), e.g. the
    artifact network's ("artifact: pen"). ink_colours: the ink tiles per marker colour, a legend note."""

    picture: Thumbnail | None = None
    unreadable: Sequence[UnreadableRegion] = ()
    extra_fates: Mapping[str, int] | None = None
    ink_colours: Mapping[str, int] | None = None


def tile_qc_image(
    slide: Slide,
    found: TissueGrid,
    reasons: np.ndarray,
    *,
    slide_id: str,
    mpp_source: str,
    params: TileParams,
    extras: QcExtras | None = None,
) -> np.ndarray:
    """The tile stage's QC picture of one slide: the slide at `qc_size` (QC_LONG_SIDE_PX on its long
    side, its own size where smaller), each candidate tile coloured by its reason code in `reasons`
    (`wsi.tiling.grid.REASON_NAMES`: kept, background, blurry, unreadable and the artifacts), a legend with
    the counts, the id and the mpp; `extras` (`QcExtras`) what the reads and networks add."""
    extras = extras or QcExtras()
    picture = extras.picture
    w0, h0 = slide.dimensions
    thumb, unknown = _qc_thumbnail(found, picture, qc_size((w0, h0)))
    coords = found.candidate_coords
    fates = _fates(params, extras.extra_fates)
    legend = _legend(slide, found, reasons, fates, slide_id=slide_id, mpp_source=mpp_source, params=params,
                     extras=extras)  # fmt: skip
    return render_qc(
        thumb,
        found.mask,
        scale=(thumb.shape[1] / w0, thumb.shape[0] / h0),
        step_px=found.grid.step_px,
        tiles={name: coords[reasons == code] for name, code in fates.items()},
        legend=legend,
        unknown=unknown,
        um_per_px=slide.mpp * w0 / thumb.shape[1],
    )


def _fates(params: TileParams, extra_fates: Mapping[str, int] | None) -> dict[str, int]:
    """Reason code by legend name: every filter that ran (blood only when on), then the network's."""
    fates = {name: code for code, name in REASON_NAMES.items()}
    if not params.artifacts.on("blood"):  # off by default: no legend line for a filter that did not run
        del fates["blood"]
    fates.update(extra_fates or {})
    return fates


def _legend(
    slide: Slide, found: TissueGrid, reasons: np.ndarray, fates: Mapping[str, int], *, slide_id: str,
    mpp_source: str, params: TileParams, extras: QcExtras,
) -> QcLegend:  # fmt: skip
    """The legend under the map: the count of every fate (even 0), the tiles outside the tissue, and the
    notes a reader needs to trust it (undecodable regions, the mask's left-outs, ink by colour)."""
    picture, unreadable, ink_colours = extras.picture, extras.unreadable, extras.ink_colours
    counts = {name: int((reasons == code).sum()) for name, code in fates.items()}
    counts["outside tissue"] = len(found.grid) - len(found.candidates)
    regions = distinct_regions(found.unreadable, picture.unreadable if picture else (), unreadable)
    if found.unreadable:
        counts[UNKNOWN_KEY] = len(found.unreadable)
    return QcLegend(
        title=slide_id,
        subtitle=(
            f"mpp {slide.mpp:.4g} um/px ({mpp_source})  |  tiles {params.tile_um:g} um at {params.tile_px} px"
            f"  |  {found.background.kind} background"
        ),
        counts=counts,
        notes=(
            *((f"cannot be decoded: {describe_regions(regions)}",) if regions else ()),
            *((f"outside the tissue mask: {found.left_out.describe()}",) if found.left_out else ()),
            *((f"ink by marker colour: {_by_colour(ink_colours)}",) if ink_colours else ()),
        ),
    )


def _by_colour(ink_colours: Mapping[str, int]) -> str:
    """e.g. "80 red, 40 brown" (most first)."""
    return ", ".join(f"{n} {c}" for c, n in sorted(ink_colours.items(), key=lambda kv: -kv[1]))


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
    um_per_px: float | None = None,
) -> np.ndarray:
    """(H, W, 3) uint8 QC image: the map (the thumbnail, its size) on top, the legend panel below.

    thumb: (h, w, 3) uint8; mask: tissue mask, any size (resized to the thumbnail); scale: thumbnail
    pixels per level-0 pixel (sx, sy); step_px: tile side in level-0 pixels; tiles: fate (a key of
    FATE_RGB) -> (N, 2) level-0 top-left coordinates; unknown: (h, w) bool, what could not be decoded
    (hatched); um_per_px: micrometres per map pixel, for the legend's scale bar (None: no bar). Without
    `legend` only the map is returned. A map pixel is the thumbnail's wherever no mark is drawn.
    """
    img = np.ascontiguousarray(thumb[..., :3], dtype=np.uint8).copy()  # (h, w, 3); marks drawn box by box
    h, w = img.shape[:2]
    if unknown is not None and unknown.shape == (h, w):
        rows, cols = np.nonzero(unknown)
        stripe = (rows + cols) // 4 % 2 == 0  # diagonal hatching, 4 px stripes
        img[rows[stripe], cols[stripe]] = UNKNOWN_RGB
    sx, sy = scale
    line = 2 if step_px * min(sx, sy) >= 48 else 1  # a rejected tile's border: 2 px where boxes are big
    for fate, rgb in FATE_RGB.items():
        colour = np.asarray(rgb, np.uint16) + 1
        thin = fate in OUTLINED
        width = 1 if thin else line
        for x, y in np.asarray(tiles.get(fate, ()), dtype=np.float64).reshape(-1, 2).tolist():
            x0, y0 = round(x * sx), round(y * sy)
            x1, y1 = round((x + step_px) * sx), round((y + step_px) * sy)
            x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(max(x1, x0 + 1), w), min(max(y1, y0 + 1), h)
            if x0 >= x1 or y0 >= y1:
                continue
            box = img[y0:y1, x0:x1]
            if not thin:  # a rejected tile: filled half transparent in its reason's colour
                box[:] = _blend(box, colour)
            box[:width, :] = box[-width:, :] = rgb  # the border, so neighbouring tiles stay apart
            box[:, :width] = box[:, -width:] = rgb
    if mask.shape != (h, w):
        resized = Image.fromarray(mask.astype(np.uint8) * 255).resize((w, h), Image.Resampling.NEAREST)
        mask = np.asarray(resized) > 0
    rows, cols = np.nonzero(find_boundaries(mask, "inner"))
    dash = (rows + cols) // 3 % 2 == 0  # 3 px dashes, black then white: readable on glass and stain
    img[rows[dash], cols[dash]] = OUTLINE_RGB
    img[rows[~dash], cols[~dash]] = OUTLINE_DASH_RGB
    return img if legend is None else with_legend(img, legend, um_per_px)


def _blend(box: np.ndarray, colour_plus_1: np.ndarray) -> np.ndarray:
    """`box` blended with a colour at _FILL_ALPHA = 1/2, rounded: v / 2 + c / 2 + 1/2, floored, is
    (v + c + 1) >> 1 exactly (the float form, clipped, gives the same bytes: tested), in a third fewer
    numpy calls per box (a 10 mm slide draws hundreds)."""
    out = box.astype(np.uint16)
    out += colour_plus_1
    out >>= 1
    return out


def qc_size(level0_size: tuple[int, int], long_side_px: int = QC_LONG_SIDE_PX) -> tuple[int, int]:
    """(w, h) of the map for a slide of `level0_size` px: QC_LONG_SIDE_PX on the long side, or the
    slide's own size where it is smaller."""
    w0, h0 = level0_size
    f = min(1.0, long_side_px / max(w0, h0, 1))
    return max(1, round(w0 * f)), max(1, round(h0 * f))


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


__all__ = [  # the palette and the legend re-exported: what the tile stage and view import from here
    "ARTIFACT_RGB", "BACKGROUND_RGB", "BLURRY_RGB", "FATE_RGB", "KEPT_RGB", "OUTLINE_DASH_RGB", "OUTLINE_RGB",
    "QC_LONG_SIDE_PX", "UNKNOWN_KEY", "UNKNOWN_RGB", "UNREADABLE_RGB", "QcExtras", "QcLegend", "png_bytes",
    "qc_picture_mpp", "qc_size", "render_qc", "save_png", "tile_qc_image",
]  # fmt: skip

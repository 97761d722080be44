"""Heatmaps of per-tile contributions, over a slide thumbnail or a blank canvas at the tile positions.

Values are signed (towards / against the predicted class): a diverging colour map centred on zero, red
towards the prediction, blue against, the scale symmetric; a model explained by its attention
(TransMIL) draws weights >= 0 the same way, labelled as attention. Over a slide the colour goes on the
tissue only (`wsi.tiling.tissue`'s mask); tissue under no scored tile is greyed and hatched, never read
as a tile near 0. The colour is half transparent and the darkest ends are left out so the stain stays
readable; the picture is cropped to the tissue and the tiles, and the colour bar says what a value
means (`label`: the task kind's sentence, e.g. values + the model's constant = the log-odds).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.files import atomic_path
from wsi.slides.thumbnail import read_thumbnail

log = logging.getLogger(__name__)

#: longest side of a canvas drawn without a slide
_CANVAS_PX = 1024
#: colour bar labels: per-tile contributions (most models; the task kind says more), attention weights
CONTRIBUTION_LABEL = "each tile's contribution to the predicted class (logit units)"
ATTENTION_LABEL = (
    "attention weight of each tile: how much the model reads it (higher: more); not a direction, and not "
    "the tile's effect on the prediction"
)
#: the colour bar's line for tissue that no scored tile covers
LEFT_OUT_LABEL = "grey hatched: tissue without a scored tile (left out by the filters): no value, not 0"
#: how strongly a scored tile's colour covers the tissue: the stain stays readable under it
_ALPHA = 0.5
#: the part of RdBu_r used: its darkest red and blue hid the tissue under the strongest tiles
_CMAP_RANGE = (0.1, 0.9)
#: tissue left out: grey, hatched every this many pixels
_HATCH_PX = 6
_HATCH_RGB = (0.45, 0.45, 0.45)
#: neighbourhood over which a heatmap tells glass from tissue, micrometres
_GLASS_UM = 8.0
#: margin kept around the tissue and tiles when the picture is cropped to them, share of the long side
_CROP_PAD = 0.02


def contribution_to_class(contributions: np.ndarray, cls: int) -> np.ndarray:
    """(N, C) per-class logit contributions -> (N,) contribution to class `cls` against the others
    (for two classes exactly each tile's share of the log-odds)."""
    others = np.delete(contributions, cls, axis=1)  # (N, C-1)
    return contributions[:, cls] - others.mean(axis=1)


# What a value means, said under the colour bar. Every model explained by contributions decomposes its
# logits exactly: logits = base + the tiles' contributions summed (models/attribution.py, docs/training.md
# "Per-tile contributions and tile effects"), so the drawn values and one constant add up to the output.
def class_scale(predicted: str, classes: Sequence[str]) -> str:
    """The colour bar's words for a class's map (`contribution_to_class`)."""
    others = [c for c in classes if c != predicted]
    if len(others) == 1:
        return (
            f"each tile's share of the log-odds of {predicted} against {others[0]} (logit units): red "
            f"towards {predicted}, blue towards {others[0]}\nthe tiles' values and the model's constant add "
            "up to the log-odds"
        )
    return (
        f"each tile's push towards {predicted} against the mean of the other classes (logit units): red "
        f"towards {predicted}, blue against\nthe tiles' values and the model's constant add up to "
        f"{predicted}'s logit minus the mean of the others'"
    )


def value_scale(target: str) -> str:
    """The colour bar's words for a continuous target's map (values in the target's units)."""
    return (
        f"each tile's contribution to the predicted {target} (in its units): red raises it, blue lowers "
        "it\nthe tiles' values and the model's constant add up to the prediction"
    )


RISK_SCALE = (
    "each tile's contribution to the risk score (log hazard): red raises the risk, blue lowers it\nthe "
    "tiles' values and the model's constant add up to the risk score"
)


def probability_text(p: float) -> str:
    """A probability as a title shows it, "p=0.612", but never p=1.000 or p=0.000 for what is not:
    "p>0.999" for 0.99993, "p<0.001" for 4e-5; "p n/a" where it is not finite."""
    if not np.isfinite(p):
        return "p n/a"
    if 0.999 < p < 1.0:
        return "p>0.999"
    if 0.0 < p < 0.001:
        return "p<0.001"
    return f"p={p:.3f}" if 0.0 < p < 1.0 else f"p={p:g}"


@dataclass(frozen=True)
class HeatmapImage:
    """The map a heatmap PNG shows, before the figure around it."""

    image: np.ndarray  # (H, W, 3) float32 RGB in [0, 1], cropped
    vmax: float  # the colour scale runs from -vmax to +vmax
    tissue: np.ndarray | None  # (H, W) bool: the thumbnail's tissue (None: drawn without a slide)
    scored: np.ndarray  # (H, W) bool: tissue (or canvas) under a tile with a finite value
    left_out: bool  # some tissue lies under no scored tile (hatched)
    offset_px: tuple[int, int]  # (x, y) of the crop's top-left corner in the uncropped picture
    px_per_um: float


def heatmap_cmap() -> Any:
    """RdBu_r without its darkest ends (`_CMAP_RANGE`)."""
    import matplotlib.pyplot as plt
    from matplotlib import colors

    lo, hi = _CMAP_RANGE
    ends = plt.get_cmap("RdBu_r")(np.linspace(lo, hi, 256))
    return colors.LinearSegmentedColormap.from_list("RdBu_r_readable", ends)


def heatmap_image(
    *,
    coords_um: np.ndarray,
    tile_um: float,
    values: np.ndarray,
    thumbnail: np.ndarray | None = None,
    thumb_mpp: float | None = None,
) -> HeatmapImage:
    """`values` (N,) as squares of `tile_um` at `coords_um` (N, 2 top-left x, y), over the slide's
    `thumbnail` (H, W, 3 uint8 at `thumb_mpp` um/px) on its tissue only, or on a blank canvas."""
    from matplotlib import colors

    coords_um = np.asarray(coords_um, dtype=np.float64).reshape(-1, 2)
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    tissue = None
    if thumbnail is not None and thumb_mpp:
        thumbnail, thumb_mpp = _fit(thumbnail, thumb_mpp, _CANVAS_PX)
        rgb = np.ascontiguousarray(thumbnail[..., :3])
        base = rgb.astype(np.float32) / 255.0
        px_per_um = 1.0 / thumb_mpp
        tissue = _tissue(rgb, thumb_mpp)
    else:
        extent_um = (coords_um.max(axis=0) + tile_um) if len(coords_um) else np.array([tile_um] * 2)
        px_per_um = _CANVAS_PX / float(extent_um.max())
        w, h = (np.ceil(extent_um * px_per_um).astype(int) + 1).tolist()
        base = np.full((h, w, 3), 0.93, dtype=np.float32)  # light grey: shows the extent
    h, w = base.shape[:2]
    finite = values[np.isfinite(values)]
    vmax = float(np.abs(finite).max()) if len(finite) else 0.0
    vmax = vmax or 1.0
    rgba = heatmap_cmap()(colors.Normalize(vmin=-vmax, vmax=vmax)(values))  # (N, 4)
    colour = np.zeros((h, w, 3), dtype=np.float32)
    covered = np.zeros((h, w), dtype=bool)
    side = max(1, round(tile_um * px_per_um))
    for (x_um, y_um), c, ok in zip(coords_um, rgba, np.isfinite(values), strict=True):
        if not ok:  # no value: left out, not a tile near 0
            continue
        x0, y0 = max(round(x_um * px_per_um), 0), max(round(y_um * px_per_um), 0)
        colour[y0 : y0 + side, x0 : x0 + side] = c[:3]
        covered[y0 : y0 + side, x0 : x0 + side] = True
    scored = covered if tissue is None else covered & tissue
    image = base.copy()
    a = _ALPHA if tissue is not None else 1.0
    image[scored] = base[scored] * (1 - a) + colour[scored] * a
    left = np.zeros((h, w), dtype=bool) if tissue is None else tissue & ~covered
    if left.any():  # greyed (the stain's lightness kept) and hatched
        grey = base[left].mean(axis=1, keepdims=True) * 0.6 + 0.4
        image[left] = np.repeat(grey, 3, axis=1)
        ys, xs = np.nonzero(left)
        stripe = (ys + xs) % _HATCH_PX == 0
        image[ys[stripe], xs[stripe]] = _HATCH_RGB
    x0, y0, x1, y1 = _crop_box(covered | (tissue if tissue is not None else covered), w, h)
    crop = (slice(y0, y1), slice(x0, x1))
    return HeatmapImage(
        image=image[crop], vmax=vmax, tissue=None if tissue is None else tissue[crop], scored=scored[crop],
        left_out=bool(left.any()), offset_px=(x0, y0), px_per_um=px_per_um,
    )  # fmt: skip


def _tissue(rgb: np.ndarray, mpp: float) -> np.ndarray:
    """(H, W) bool: the thumbnail's tissue (`wsi.tiling.tissue`), less the near-white glass it encloses
    or borders (a pale scan's glass can pass the saturation split): pixels whose neighbourhood (about
    `_GLASS_UM` across) is mostly above the tile filters' white level are glass and stay uncoloured."""
    from scipy.ndimage import uniform_filter

    from wsi.tiling.background import detect_background
    from wsi.tiling.params import TileParams
    from wsi.tiling.tissue import tissue_mask

    dark = detect_background(rgb).kind == "dark"
    mask = tissue_mask(rgb, mpp=mpp, dark=dark)
    if dark:
        return mask
    low = np.minimum(np.minimum(rgb[..., 0], rgb[..., 1]), rgb[..., 2])
    stained = (low < TileParams().white_level).astype(np.float32)
    size = max(3, round(_GLASS_UM / mpp) | 1)
    return mask & (uniform_filter(stained, size=size) > 0.5)


def _crop_box(keep: np.ndarray, w: int, h: int) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1): the bounding box of `keep` with a margin of `_CROP_PAD` of the long side
    (the whole picture when `keep` is empty)."""
    if not keep.any():
        return 0, 0, w, h
    ys, xs = np.nonzero(keep)
    pad = round(_CROP_PAD * max(w, h))
    return (max(int(xs.min()) - pad, 0), max(int(ys.min()) - pad, 0), min(int(xs.max()) + 1 + pad, w),
            min(int(ys.max()) + 1 + pad, h))  # fmt: skip


def render_heatmap(
    *,
    coords_um: np.ndarray,
    tile_um: float,
    values: np.ndarray,
    out_png: Path,
    thumbnail: np.ndarray | None = None,
    thumb_mpp: float | None = None,
    title: str = "",
    label: str = CONTRIBUTION_LABEL,
) -> None:
    """Draw `values` (N,) as squares of `tile_um` at `coords_um` (N, 2 top-left x, y) and save a PNG
    (`heatmap_image`, with a colour bar under it whose `label` says what a value means).

    With `thumbnail` (H, W, 3 uint8 at `thumb_mpp` um/px) the squares are blended over the slide's tissue.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import colors

    drawn = heatmap_image(coords_um=coords_um, tile_um=tile_um, values=values,
                          thumbnail=thumbnail, thumb_mpp=thumb_mpp)  # fmt: skip
    h, w = drawn.image.shape[:2]
    fig, ax = plt.subplots(figsize=(6, 6 * h / max(w, 1) + 1.4), dpi=150)
    ax.imshow(drawn.image, interpolation="nearest")
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=9)
    norm = colors.Normalize(vmin=-drawn.vmax, vmax=drawn.vmax)
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=heatmap_cmap()), ax=ax, orientation="horizontal",
                       fraction=0.04, pad=0.02, shrink=0.9)  # fmt: skip
    if drawn.left_out:
        label += f"\n{LEFT_OUT_LABEL}"
    bar.set_label(label, fontsize=7)
    bar.ax.tick_params(labelsize=7)
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight", pad_inches=0.05)
    plt.close(fig)


def _fit(image: np.ndarray, mpp: float, longest: int) -> tuple[np.ndarray, float]:
    """`image` box-filtered down to at most `longest` px on its long side, with its new um/px. The PNG
    is ~900 px wide, so blending and resampling a 2,048 px thumbnail cost more than half of every
    heatmap for pixels no one sees."""
    from PIL import Image

    h, w = image.shape[:2]
    if max(h, w) <= longest:
        return image, mpp
    scale = longest / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    rgb = Image.fromarray(np.ascontiguousarray(image[..., :3]))
    small = np.asarray(rgb.resize(size, Image.Resampling.BOX))
    return small, mpp * max(h, w) / max(small.shape[:2])


def slide_heatmap(
    thumb: tuple[Path, float | None],
    coords_um: np.ndarray,
    tile_um: float,
    values: np.ndarray,
    out_png: Path,
    title: str,
    backend: str = "openslide",
    label: str = CONTRIBUTION_LABEL,
) -> None:
    """`values` (N,) over the slide's thumbnail (about 2,048 px on the long side); `thumb` is the
    slide's (path, level-0 mpp or None for the metadata's)."""
    from wsi.slides.slide import open_slide

    slide_path, mpp = thumb
    with open_slide(slide_path, backend=backend, mpp=mpp) as slide:
        w_px, h_px = slide.dimensions
        thumb_mpp = max(w_px, h_px) * slide.mpp / 2048.0
        image = read_thumbnail(slide, thumb_mpp).image
        thumb_mpp = max(w_px, h_px) * slide.mpp / max(image.shape[:2])  # the size actually returned
    render_heatmap(
        coords_um=coords_um, tile_um=tile_um, values=values, out_png=out_png,
        thumbnail=image, thumb_mpp=thumb_mpp, title=title, label=label,
    )  # fmt: skip


def tile_values(
    slide_id: str,
    bag_path: Path,
    sample: Mapping[str, Any],
    case_maps: Mapping[str, np.ndarray],
    sl: slice,
    out: Path,
    thumb: tuple[Path, float | None] | None,
    heatmaps: Sequence[tuple[str, np.ndarray, str]],
) -> None:
    """heatmaps/<slide>.json (`wsi.formats.tile_values`): every output's per-tile contribution, the numbers
    behind the PNGs, for `wsi view` to draw at full resolution. `case_maps` and `heatmaps` are the case's (the
    slide's rows: `sl`); the main heatmap's values name the output it shows. Bags with tile positions
    only. A failure costs the viewer its heatmap, not the prediction: it is logged."""
    if "coords_um" not in sample or not case_maps:
        return
    maps = {k: v[sl] for k, v in case_maps.items()}
    main = heatmaps[0][1][sl] if heatmaps else None
    from wsi.formats.bags import read_bag_attrs
    from wsi.formats.tile_values import write_tile_values

    try:
        attrs = read_bag_attrs(bag_path)
        mpp = thumb[1] if thumb is not None and thumb[1] is not None else attrs.get("mpp")
        predicted = next((k for k, v in maps.items() if main is not None and np.array_equal(v, main)), None)
        write_tile_values(
            out / "heatmaps" / f"{slide_id}.json", slide=slide_id, coords_um=np.asarray(sample["coords_um"]),
            tile_um=float(sample.get("tile_um") or attrs["tile_size_um"]), outputs=maps,
            mpp=None if mpp is None else float(mpp), predicted=predicted,
        )  # fmt: skip
    except Exception as exc:
        log.warning("%s: heatmaps/%s.json not written (%s: %s)", slide_id, slide_id, type(exc).__name__, exc)

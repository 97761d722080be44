"""Heatmaps of per-tile contributions, over a slide thumbnail or a blank canvas at the tile positions.

Values are signed (towards / against the predicted class), so the colour map is diverging and centred
on zero: red pushes towards the prediction, blue against it, and the colour scale is symmetric. A model
explained by its attention (TransMIL) draws weights >= 0 the same way, labelled as attention.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.files import atomic_path
from wsi.slides.thumbnail import read_thumbnail

log = logging.getLogger(__name__)

#: longest side of a canvas drawn without a slide
_CANVAS_PX = 1024
#: colour bar labels: per-tile contributions (most models), attention weights (TransMIL)
CONTRIBUTION_LABEL = "contribution to predicted class"
ATTENTION_LABEL = "attention weight"


def contribution_to_class(contributions: np.ndarray, cls: int) -> np.ndarray:
    """(N, C) per-class logit contributions -> (N,) contribution to class `cls` against the others
    (for two classes exactly each tile's share of the log-odds)."""
    others = np.delete(contributions, cls, axis=1)  # (N, C-1)
    return contributions[:, cls] - others.mean(axis=1)


def render_heatmap(
    *,
    coords_um: np.ndarray,
    tile_size_um: float,
    values: np.ndarray,
    out_png: Path,
    thumbnail: np.ndarray | None = None,
    thumb_mpp: float | None = None,
    title: str = "",
    label: str = CONTRIBUTION_LABEL,
) -> None:
    """Draw `values` (N,) as squares of `tile_size_um` at `coords_um` (N, 2 top-left x, y) and save a PNG.

    With `thumbnail` (H, W, 3 uint8 at `thumb_mpp` um/px) the squares are blended over the slide.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import colors

    coords_um = np.asarray(coords_um, dtype=np.float64).reshape(-1, 2)
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if thumbnail is not None and thumb_mpp:
        thumbnail, thumb_mpp = _fit(thumbnail, thumb_mpp, _CANVAS_PX)
        base = thumbnail.astype(np.float32) / 255.0
        px_per_um = 1.0 / thumb_mpp
    else:
        extent_um = (coords_um.max(axis=0) + tile_size_um) if len(coords_um) else np.array([tile_size_um] * 2)
        px_per_um = _CANVAS_PX / float(extent_um.max())
        w, h = (np.ceil(extent_um * px_per_um).astype(int) + 1).tolist()
        base = np.full((h, w, 3), 0.93, dtype=np.float32)  # light grey: shows the extent
    h, w = base.shape[:2]
    vmax = float(np.abs(values).max()) if len(values) else 1.0
    norm = colors.Normalize(vmin=-(vmax or 1.0), vmax=vmax or 1.0)
    cmap = plt.get_cmap("RdBu_r")
    overlay = np.zeros((h, w, 4), dtype=np.float32)  # (H, W, RGBA)
    rgba = cmap(norm(values))  # (N, 4)
    side = max(1, round(tile_size_um * px_per_um))
    for (x_um, y_um), color in zip(coords_um, rgba, strict=True):
        x0, y0 = round(x_um * px_per_um), round(y_um * px_per_um)
        overlay[max(y0, 0) : min(y0 + side, h), max(x0, 0) : min(x0 + side, w)] = color
    alpha = overlay[..., 3:4] * (0.6 if thumbnail is not None else 1.0)
    image = base * (1 - alpha) + overlay[..., :3] * alpha

    fig, ax = plt.subplots(figsize=(6, 6 * h / max(w, 1) + 0.6), dpi=150)
    ax.imshow(image, interpolation="nearest")
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=9)
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, fraction=0.035, pad=0.02,
                 label=label)  # fmt: skip
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png")
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
    tile_size_um: float,
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
        coords_um=coords_um, tile_size_um=tile_size_um, values=values, out_png=out_png,
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
            tile_size_um=float(sample.get("tile_size_um") or attrs["tile_size_um"]), outputs=maps,
            mpp=None if mpp is None else float(mpp), predicted=predicted,
        )  # fmt: skip
    except Exception as exc:
        log.warning("%s: heatmaps/%s.json not written (%s: %s)", slide_id, slide_id, type(exc).__name__, exc)

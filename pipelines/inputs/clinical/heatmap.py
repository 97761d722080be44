"""Per-patch contribution maps over the input image, as a PNG: the image and the overlay side by side.

Contributions are signed (towards or away from the class), so they use a diverging colour map with
limits symmetric around 0, and the overlay is more opaque where the magnitude is larger. Volumes are
shown as their middle axial slice (with that slice's patches) or as a maximum-intensity projection
(with, per column, the patch of largest magnitude along depth).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from wsi.core.files import atomic_path

Projection = Literal["mid", "max"]
_MAX_ALPHA = 0.65


def _to_display(image: np.ndarray) -> np.ndarray:
    """(H, W, C) any scale -> (H, W, 3) float in [0, 1] (by the 1st/99th percentile)."""
    lo, hi = np.percentile(image, (1, 99))
    unit = np.clip((image - lo) / max(float(hi - lo), 1e-6), 0.0, 1.0)
    return np.repeat(unit, 3, axis=-1) if unit.shape[-1] == 1 else unit[..., :3]


def _upsample(grid: np.ndarray, size_px: tuple[int, int]) -> np.ndarray:
    """(gh, gw) patch values -> (H, W), each patch a block (patches are the model's units)."""
    t = torch.from_numpy(np.ascontiguousarray(grid, dtype=np.float32))[None, None]
    return F.interpolate(t, size=size_px, mode="nearest")[0, 0].numpy()


def fit_long_side(image: np.ndarray, max_px: int) -> np.ndarray:
    """(H, W, C) shrunk (antialiased) so that its longer side is at most `max_px`; never enlarged."""
    h, w = image.shape[:2]
    scale = max_px / max(h, w)
    if scale >= 1.0:
        return image
    size = (max(1, round(h * scale)), max(1, round(w * scale)))
    t = torch.from_numpy(np.ascontiguousarray(np.moveaxis(image, -1, 0), dtype=np.float32))[None]
    out = F.interpolate(t, size=size, mode="bilinear", antialias=True, align_corners=False)[0]  # (C, h, w)
    return np.moveaxis(out.numpy(), 0, -1)


def project(
    volume: np.ndarray, grid: np.ndarray, projection: Projection = "mid"
) -> tuple[np.ndarray, np.ndarray]:
    """(D, H, W, C) volume and (gd, gh, gw) grid -> a (H, W, C) image and its (gh, gw) grid."""
    if projection == "mid":
        mid = volume.shape[0] // 2
        return volume[mid], grid[min(grid.shape[0] - 1, mid * grid.shape[0] // volume.shape[0])]
    if projection == "max":
        pick = np.abs(grid).argmax(axis=0)[None]  # (1, gh, gw): depth of the strongest patch
        return volume.max(axis=0), np.take_along_axis(grid, pick, axis=0)[0]
    raise ValueError(f"projection must be 'mid' or 'max', not {projection!r}")


def render(image: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """(H, W, C) image + (gh, gw) signed values -> (H, 2W, 3) uint8: image | overlay."""
    from matplotlib import colormaps  # only when drawing: keeps `import wsi.pipelines.inputs.clinical` light

    base = _to_display(image.astype(np.float32))
    h, w = base.shape[:2]
    values = _upsample(grid, (h, w))
    limit = float(np.abs(values).max()) or 1.0
    rgba = colormaps["RdBu_r"](0.5 + 0.5 * values / limit)  # (H, W, 4); blue < 0 < red
    alpha = (_MAX_ALPHA * np.abs(values) / limit)[..., None]
    overlay = (1.0 - alpha) * base + alpha * rgba[..., :3]
    return (np.concatenate([base, overlay], axis=1) * 255.0 + 0.5).astype(np.uint8)


def save_heatmap(
    image: np.ndarray,
    contributions: np.ndarray,
    grid_shape: tuple[int, ...],
    out_png: str | Path,
    *,
    projection: Projection = "mid",
    title: str = "",
    min_px: int = 256,
) -> Path:
    """Write the heatmap of `contributions` (N,) on `image` ((H, W, C) or (D, H, W, C)) to `out_png`.

    `grid_shape` is the model's patch grid for this input ((gh, gw) or (gd, gh, gw), row-major tokens).
    Images smaller than `min_px` on their longer side are enlarged by a whole factor for legibility.
    """
    values = np.asarray(contributions, dtype=np.float32).reshape(-1)
    if values.size != int(np.prod(grid_shape)):
        raise ValueError(f"{values.size} contributions do not fill a patch grid of {grid_shape}")
    grid = values.reshape(grid_shape)
    if len(grid_shape) == 3:
        image, grid = project(image, grid, projection)
    longest = max(image.shape[:2])
    if longest < min_px:  # small model inputs (3D slices): whole-pixel enlargement, stays crisp
        k = -(-min_px // longest)
        image = image.repeat(k, axis=0).repeat(k, axis=1)
    rgb = render(image, grid)
    pil = Image.fromarray(rgb)
    if title:
        band = Image.new("RGB", (pil.width, 16), "white")
        ImageDraw.Draw(band).text((4, 2), title, fill="black")
        canvas = Image.new("RGB", (pil.width, pil.height + 16), "white")
        canvas.paste(band, (0, 0))
        canvas.paste(pil, (0, 16))
        pil = canvas
    out_png = Path(out_png)
    with atomic_path(out_png) as tmp:
        pil.save(tmp, format="PNG")
    return out_png

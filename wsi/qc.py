"""QC image: the slide thumbnail with the tissue outline and every tissue tile coloured by its fate.

One glance tells whether the mask found the tissue and whether the filters threw away good tiles:
kept tiles are green, mostly-background ones blue, blurry ones red, and the tissue outline is yellow.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image
from skimage.segmentation import find_boundaries

from wsi.files import atomic_path

KEPT_RGB = (0, 170, 0)
BACKGROUND_RGB = (30, 90, 230)
BLURRY_RGB = (220, 30, 30)
OUTLINE_RGB = (255, 210, 0)
_FILL_ALPHA = 0.25


def render_qc(
    thumb: np.ndarray,
    mask: np.ndarray,
    *,
    scale: tuple[float, float],
    step_px: float,
    kept: np.ndarray,
    background: np.ndarray,
    blurry: np.ndarray,
) -> np.ndarray:
    """(H, W, 3) uint8 QC image.

    thumb: (H, W, 3) uint8; mask: (h, w) bool tissue mask (resized to the thumbnail if it differs);
    scale: thumbnail pixels per level-0 pixel (sx, sy); step_px: tile side in level-0 pixels;
    kept / background / blurry: (N, 2) level-0 top-left coordinates of each group.
    """
    img = thumb[..., :3].astype(np.float32).copy()
    h, w = img.shape[:2]
    sx, sy = scale
    for coords, rgb in ((background, BACKGROUND_RGB), (blurry, BLURRY_RGB), (kept, KEPT_RGB)):
        colour = np.asarray(rgb, np.float32)
        for x, y in np.asarray(coords, dtype=np.float64).reshape(-1, 2).tolist():
            x0, y0 = round(x * sx), round(y * sy)
            x1, y1 = round((x + step_px) * sx), round((y + step_px) * sy)
            x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(max(x1, x0 + 1), w), min(max(y1, y0 + 1), h)
            if x0 >= x1 or y0 >= y1:
                continue
            box = img[y0:y1, x0:x1]
            box *= 1 - _FILL_ALPHA
            box += _FILL_ALPHA * colour
            box[0, :] = box[-1, :] = colour  # outline, so neighbouring tiles stay apart
            box[:, 0] = box[:, -1] = colour
    if mask.shape != (h, w):
        resized = Image.fromarray(mask.astype(np.uint8) * 255).resize((w, h), Image.Resampling.NEAREST)
        mask = np.asarray(resized) > 0
    img[find_boundaries(mask, mode="inner")] = OUTLINE_RGB
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


def save_png(path: str | os.PathLike[str], image: np.ndarray) -> None:
    """Write an RGB uint8 image as PNG atomically."""
    with atomic_path(Path(path)) as tmp:
        Image.fromarray(image).save(tmp, format="PNG", compress_level=1)  # faster than 6, ~6% larger

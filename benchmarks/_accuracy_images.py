"""Reading the accuracy benchmark's images and masks, resampled as asked, and a mask's share of a box."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def resized(rgb: np.ndarray, w: int, h: int) -> np.ndarray:
    return np.asarray(Image.fromarray(np.ascontiguousarray(rgb)).resize((w, h), Image.BILINEAR))


def share(mask: np.ndarray | None, box: np.ndarray) -> float:
    if mask is None:
        return 0.0
    x0, y0, x1, y1 = (round(float(v)) for v in box)
    part = mask[y0:y1, x0:x1]
    return float(part.mean()) if part.size else 0.0


def load_image(path: Path | str, mode: str, coarser: float) -> np.ndarray:
    """An image (RGB) or mask (L, as bool) read, and resampled to `coarser` times its um/px."""
    im = Image.open(path).convert(mode)
    if coarser > 1.0:
        size = (max(1, round(im.width / coarser)), max(1, round(im.height / coarser)))
        im = im.resize(size, Image.LANCZOS if mode == "RGB" else Image.BILINEAR)
    return np.asarray(im) if mode == "RGB" else np.asarray(im) > 127


def as_jpeg(rgb: np.ndarray, quality: int) -> np.ndarray:
    """`rgb` saved and read back as a JPEG of `quality` (PIL's defaults: 4:2:0 chroma), as an export is."""
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, "JPEG", quality=quality)
    return np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))

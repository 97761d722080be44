"""A binary mask (the tissue mask of a thumbnail) as polygons with holes, in level-0 pixels.

skimage's `find_contours` traces every boundary of the zero-padded mask at level 0.5 (so every contour
closes); shells and holes wind opposite ways, which tells them apart: the largest contour is always a
shell, and each hole goes to the smallest shell that holds it.
"""

from __future__ import annotations

import numpy as np
from matplotlib.path import Path as MplPath
from skimage.measure import approximate_polygon, find_contours

#: contours enclosing less than this many mask pixels are dropped (single-pixel specks)
MIN_AREA_PX = 2.0


def _signed_area(ring: np.ndarray) -> float:
    x, y = ring[:, 0], ring[:, 1]
    return 0.5 * float(np.dot(x[:-1], y[1:]) - np.dot(x[1:], y[:-1]))


def mask_polygons(
    mask: np.ndarray, *, scale: tuple[float, float], tolerance: float = 0.5
) -> list[list[np.ndarray]]:
    """Polygons ([shell, hole, ...], each a closed (K, 2) ring of level-0 (x, y)) of a (h, w) bool mask.

    scale: level-0 pixels per mask pixel (x, y); a mask pixel (r, c) covers x in [c, c + 1) * sx.
    tolerance: in mask pixels, how far the simplified outline may stray from the traced one.
    """
    padded = np.pad(np.asarray(mask, dtype=bool), 1).astype(np.float32)
    rings: list[tuple[np.ndarray, float]] = []
    for contour in find_contours(padded, 0.5):
        ring = approximate_polygon(contour, tolerance) if tolerance > 0 else contour
        if len(ring) < 4:
            continue
        xy = np.stack([ring[:, 1] - 0.5, ring[:, 0] - 0.5], axis=1)  # padded (row, col) -> mask (x, y)
        if not np.array_equal(xy[0], xy[-1]):
            xy = np.vstack([xy, xy[:1]])
        area = _signed_area(xy)
        if abs(area) >= MIN_AREA_PX:
            rings.append((xy, area))
    if not rings:
        return []
    shell_sign = np.sign(max(rings, key=lambda r: abs(r[1]))[1])
    shells = sorted((r for r in rings if np.sign(r[1]) == shell_sign), key=lambda r: abs(r[1]))
    holes = [r[0] for r in rings if np.sign(r[1]) != shell_sign]
    polygons: list[list[np.ndarray]] = [[ring] for ring, _ in shells]
    paths = [MplPath(ring) for ring, _ in shells]
    for hole in holes:
        probe = hole[0]  # a point of the hole's boundary: inside its shell and no other smaller one
        for k, path in enumerate(paths):  # smallest shell first
            if path.contains_point(probe):
                polygons[k].append(hole)
                break
    sx, sy = scale
    factor = np.array([sx, sy])
    return [[ring * factor for ring in poly] for poly in reversed(polygons)]  # largest first


__all__ = ["MIN_AREA_PX", "mask_polygons"]

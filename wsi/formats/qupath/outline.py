"""A binary mask (the tissue mask of a thumbnail) as polygons with holes, in level-0 pixels.

skimage's `find_contours` traces every boundary of the zero-padded mask at level 0.5 (so every contour
closes); shells and holes wind opposite ways, which tells them apart: the largest contour is always a
shell, and each hole goes to the smallest shell that holds it.

Every `wsi tile` run draws this outline for its QC GeoJSON, so the module stays light: the outline is
simplified with our own Ramer-Douglas-Peucker (`simplify_ring`; skimage's `approximate_polygon` would
bring in all of scipy.signal and scipy.stats, about 0.8 s of import) and a hole is placed with an
even-odd test (`ring_contains`) instead of matplotlib's Path.
"""

from __future__ import annotations

import numpy as np
from skimage.measure import find_contours  # lazily loaded: only skimage.measure._find_contours

#: contours enclosing less than this many mask pixels are dropped (single-pixel specks)
MIN_AREA_PX = 2.0


def _signed_area(ring: np.ndarray) -> float:
    x, y = ring[:, 0], ring[:, 1]
    return 0.5 * float(np.dot(x[:-1], y[1:]) - np.dot(x[1:], y[:-1]))


def simplify_ring(points: np.ndarray, tolerance: float) -> np.ndarray:
    """The (L, 2) subset of a (K, 2) chain that strays at most `tolerance` from it (Ramer-Douglas-Peucker).

    Keeps both ends (a closed ring stays closed); a point's distance is to the nearest point of the
    segment between the kept points around it, and a segment whose farthest point is over `tolerance`
    away splits there (the first such point on a tie), so a ring whose ends coincide splits at its
    farthest point first. Every open segment is split in the same pass (one numpy pass per level of the
    recursion, not per segment: a 3,000-point tissue outline in ~5 ms instead of ~60); the points kept
    do not depend on that order.
    """
    n = len(points)
    if tolerance <= 0 or n < 3:
        return points
    xs, ys = np.asarray(points, dtype=np.float64).T.copy()
    keep = np.zeros(n, dtype=bool)
    keep[0] = keep[-1] = True
    i = np.arange(1, n - 1)  # the points inside segments still open, in order
    while len(i):
        kept = np.flatnonzero(keep)
        seg = np.searchsorted(kept, i, side="right") - 1  # each point's segment: kept[seg] < i < kept[seg+1]
        ax, ay = xs[kept[seg]], ys[kept[seg]]
        abx, aby = xs[kept[seg + 1]] - ax, ys[kept[seg + 1]] - ay
        dax, day = xs[i] - ax, ys[i] - ay
        dbx, dby = dax - abx, day - aby
        length2 = abx * abx + aby * aby
        along = dax * abx + day * aby
        beside = (along > 0) & (along < length2)  # the nearest point is inside the segment
        ends = np.minimum(np.hypot(dax, day), np.hypot(dbx, dby))
        cross = np.abs(abx * day - aby * dax)  # exact on half-pixel contours: ties stay ties
        dist = np.where(beside, cross / np.sqrt(np.maximum(length2, 1e-300)), ends)
        new = np.empty(len(i), dtype=bool)  # where each open segment begins
        new[0] = True
        np.not_equal(seg[1:], seg[:-1], out=new[1:])
        first = np.flatnonzero(new)
        owner = np.cumsum(new) - 1
        peak = np.maximum.reduceat(dist, first)
        at_peak = np.flatnonzero(dist == peak[owner])  # sorted; every segment has at least one
        first_peak = np.empty(len(at_peak), dtype=bool)
        first_peak[0] = True
        np.not_equal(owner[at_peak[1:]], owner[at_peak[:-1]], out=first_peak[1:])
        over = peak > tolerance
        keep[i[at_peak[first_peak]][over]] = True  # each segment's first farthest point
        i = i[over[owner] & ~keep[i]]  # split segments stay open, without their new ends
    return points[keep]


def ring_contains(ring: np.ndarray, point: np.ndarray) -> bool:
    """Whether (x, y) lies inside the closed (K, 2) ring (even-odd: crossings of a ray towards +x)."""
    x0, y0 = ring[:-1, 0], ring[:-1, 1]
    x1, y1 = ring[1:, 0], ring[1:, 1]
    px, py = float(point[0]), float(point[1])
    spans = (y0 > py) != (y1 > py)  # edges that cross the horizontal line through the point
    with np.errstate(divide="ignore", invalid="ignore"):
        x_cross = x0 + (py - y0) * (x1 - x0) / (y1 - y0)
    return bool(np.count_nonzero(spans & (x_cross > px)) % 2)


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
        ring = simplify_ring(contour, tolerance)
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
    for hole in holes:
        probe = hole[0]  # a point of the hole's boundary: inside its shell and no other smaller one
        for k, (shell, _) in enumerate(shells):  # smallest shell first
            if ring_contains(shell, probe):
                polygons[k].append(hole)
                break
    sx, sy = scale
    factor = np.array([sx, sy])
    return [[ring * factor for ring in poly] for poly in reversed(polygons)]  # largest first


__all__ = ["MIN_AREA_PX", "mask_polygons", "ring_contains", "simplify_ring"]

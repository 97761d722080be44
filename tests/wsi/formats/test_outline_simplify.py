"""The QC outline's own geometry (wsi.formats.qupath.outline, issue 35): Ramer-Douglas-Peucker done level by
level keeps the points the textbook recursion keeps, stays within the tolerance like skimage's
approximate_polygon, and the even-odd test agrees with matplotlib's Path; neither library is imported
by the outline any more (tests/pipelines/tile/test_tile_imports.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from matplotlib.path import Path as MplPath
from scipy import ndimage
from skimage.measure import approximate_polygon, find_contours

from wsi.formats.qupath.outline import ring_contains, simplify_ring


def _recursive(points: np.ndarray, tolerance: float) -> np.ndarray:
    """The textbook recursion: split each segment at its first farthest point while that is too far."""
    keep = np.zeros(len(points), dtype=bool)
    keep[0] = keep[-1] = True

    def distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
        ab, ap = b - a, p - a
        along = float(ab @ ap)
        if 0 < along < float(ab @ ab):
            return abs(float(ab[0] * ap[1] - ab[1] * ap[0])) / float(np.sqrt(ab @ ab))
        return min(float(np.hypot(*ap)), float(np.hypot(*(p - b))))

    def split(start: int, end: int) -> None:
        if end - start < 2:
            return
        dists = [distance(points[k], points[start], points[end]) for k in range(start + 1, end)]
        k = int(np.argmax(dists))
        if dists[k] > tolerance:
            keep[start + 1 + k] = True
            split(start, start + 1 + k)
            split(start + 1 + k, end)

    split(0, len(points) - 1)
    return points[keep]


def _contours(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        noise = rng.random((40, 50)) < rng.uniform(0.3, 0.7)
        mask = ndimage.gaussian_filter(noise.astype(float), rng.uniform(0.5, 3)) > 0.5
        out += [c for c in find_contours(np.pad(mask, 1).astype(np.float32), 0.5) if len(c) > 3]
    return out


@pytest.mark.parametrize("tolerance", [0.5, 1.0, 2.5])
def test_simplify_keeps_the_recursions_points_within_the_tolerance(tolerance: float) -> None:
    rng = np.random.default_rng(1)
    walks = [np.cumsum(rng.normal(size=(300, 2)), axis=0), rng.random((60, 2)) * 10]
    for ring in [*_contours(8, 0), *walks]:
        ours = simplify_ring(ring, tolerance)
        assert np.array_equal(ours, _recursive(ring, tolerance))
        assert np.array_equal(ours[0], ring[0]) and np.array_equal(ours[-1], ring[-1])
        # as close to the traced outline as skimage's own simplification, with about as many points
        assert _max_gap(ring, ours) <= tolerance + 1e-9
        assert abs(len(ours) - len(approximate_polygon(ring, tolerance))) <= max(3, len(ours) // 10)
    assert simplify_ring(walks[0], 0) is walks[0]


def _max_gap(chain: np.ndarray, simple: np.ndarray) -> float:
    """Largest distance from a point of `chain` to the polyline `simple`."""
    best = np.full(len(chain), np.inf)
    for a, b in itertools.pairwise(simple):
        ab = b - a
        t = np.clip((chain - a) @ ab / max(float(ab @ ab), 1e-300), 0, 1)
        best = np.minimum(best, np.hypot(*(chain - a - t[:, None] * ab).T))
    return float(best.max())


def test_even_odd_agrees_with_matplotlib() -> None:
    rng = np.random.default_rng(2)
    for ring in _contours(6, 3):
        xy = ring[:, ::-1]
        points = rng.uniform(-1, 52, (40, 2))
        ours = [ring_contains(xy, p) for p in points]
        assert ours == MplPath(xy, closed=True).contains_points(points).tolist()

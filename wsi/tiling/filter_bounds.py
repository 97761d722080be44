"""A shortcut for the background and blur filters that cannot change a verdict: a tile is passed
without the full computation only when a bound, taken from a sample of its rows, proves it is neither
background nor blurry (`surely_kept`); every other tile goes through the exact filters
(`wsi.tiling.grid.classify_tiles`), so the verdicts are the same as the exact filters' on every tile.

The sample is every `STRIDE`-th row of Laplacian centres with the rows above and below them (3/8 of the
tile's pixels), and the bounds hold whatever the unsampled rows hold:

- background: the unsampled pixels are taken as background; a tile whose count is then still at most
  max_background_fraction is not background.
- blur (`wsi.tiling.blur.blur_variance`: the median over 4 x 4 blocks of the Laplacian variance over tissue
  pixels): a block's variance over its n tissue pixels is at least (s2 - s1^2 / m) / n for any m of
  them with sum s1 and sum of squares s2 (the sum of squared deviations over all n pixels is at least
  that over the m, and the m's own mean minimises theirs). With n replaced by its upper bound (the
  unsampled pixels taken as tissue) each block's bound is below its variance; the median is monotone in
  each value, so the median of the bounds is below the score when the voting blocks (a quarter tissue)
  are known from the sample alone; when they are not, the tile takes the exact path.

The sample's Laplacian is taken per channel in integers and then weighted as the grayscale is; the
exact filter rounds the float32 grayscale first, so the two differ by under 0.01 a pixel (both are the
same linear map of the pixels), which moves a variance near the threshold by far less than MARGIN.
A tile passes when its bound is at least min_blur_variance plus 1% (the exact filter sums in float32).
On sharp H&E (scores in the thousands, 40-200 times the threshold) the bound is about an eighth of the
score, so most tissue tiles pass; blurry tiles, tiles at the tissue edge and pale tiles take the exact
path. Measured on the benchmark slide: 70% pass, at a quarter of the exact filters' cost.
"""

from __future__ import annotations

import functools

import numpy as np

from wsi.tiling.blur import GRAY, min_rgb

#: a Laplacian centre row every STRIDE rows; its rows above and below are read too (3 / STRIDE)
STRIDE = 8
#: the bound must clear the threshold by this share (rounding of the exact filter's float32 sums)
MARGIN = 0.01
#: smallest tile side the shortcut is tried on (smaller tiles: the exact filters, already cheap)
MIN_PX = 64
_GRID = 4


@functools.lru_cache(maxsize=8)
def _layout(p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For a P px tile: the sampled rows (3 per centre, in order), the (4, 3T) and (4, T) 0/1 matrices
    that sum the sampled rows' and the centres' values per block row, and each block row's count of
    sampled rows (crop coordinates: Laplacian row i is tile row i + 1; k = (P - 2) // 4 rows a block)."""
    k = (p - 2) // _GRID
    centres = np.arange(0, _GRID * k, STRIDE)  # crop rows of the Laplacian centres inside the blocks
    rows = (centres[:, None] + np.arange(3)[None, :]).ravel()  # tile rows c, c+1, c+2 = crop c-1, c, c+1
    crop = rows - 1
    per_row = np.zeros((_GRID, len(rows)), np.float64)
    inside = (crop >= 0) & (crop < _GRID * k)
    per_row[crop[inside] // k, np.flatnonzero(inside)] = 1.0
    per_centre = np.zeros((_GRID, len(centres)), np.float64)
    per_centre[centres // k, np.arange(len(centres))] = 1.0
    # (P, 5): the sums of a row's pixels in each block column (tile columns 1 + c*k .. (c+1)*k), and of
    # all of them; a matrix product sums float32 rows far faster than a reduction over an axis
    per_column = np.zeros((p, _GRID + 1), np.float32)
    for c in range(_GRID):
        per_column[1 + c * k : 1 + (c + 1) * k, c] = 1.0
    per_column[:, _GRID] = 1.0
    return rows, per_row, per_centre, per_column, per_row.sum(axis=1)


def surely_kept(
    tiles: np.ndarray, *, white_level: int, max_background_fraction: float, min_blur_variance: float
) -> np.ndarray:
    """(B,) bool: (B, P, P, 3) uint8 brightfield tiles proved neither background nor blurry by the
    bounds above (False says nothing: the exact filters decide)."""
    b, p = tiles.shape[:2]
    if p < MIN_PX or b == 0:
        return np.zeros(b, bool)
    rows, _, _, per_column, _ = _layout(p)
    sub = tiles[:, rows]  # (B, 3T, P, 3)
    tissue = (min_rgb(sub) < white_level).astype(np.float32)  # (B, 3T, P) 1: a tissue pixel
    seen = tissue @ per_column  # (B, 3T, 5): per block column, and the whole row
    not_background, n_high, votes = _background_and_votes(tiles, seen, white_level, max_background_fraction)
    score = _blur_bound(sub, tissue, seen, n_high, votes)
    return not_background & (score >= min_blur_variance * (1.0 + MARGIN))


def _background_and_votes(
    tiles: np.ndarray, seen: np.ndarray, white_level: int, max_background_fraction: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(not background (B,), at most this many tissue pixels per block (B, 4, 4), the blocks that vote
    (B, 4, 4)): from the sample where it decides, from every pixel of the tiles at the tissue's edge."""
    p = tiles.shape[1]
    k = (p - 2) // _GRID
    _, per_row, _, per_column, rows_in = _layout(p)
    # background: every unsampled pixel counted as background
    glass = p * p - seen[..., _GRID].sum(axis=1, dtype=np.float64)
    not_background = glass / (p * p) <= max_background_fraction
    # tissue pixels per block: at least those seen, at most those plus every unsampled pixel
    n_low = per_row @ seen[..., :_GRID].astype(np.float64)  # (B, 4, 4) block row x block column
    n_high = n_low + ((k - rows_in) * k)[:, None]
    quarter = 0.25 * k * k
    votes, never = n_low >= quarter, n_high < quarter
    unsure = np.flatnonzero(~(not_background & (votes | never).all(axis=(1, 2))))
    if len(unsure):  # at the tissue's edge: count every pixel of those tiles instead
        whole_tissue = (min_rgb(tiles[unsure]) < white_level).astype(np.float32)  # (b', P, P)
        # per row, the tissue pixels of each block column and of the whole row (whole numbers, exact
        # in float32), then summed over each block's rows: two matrix products, ~3x faster than
        # reducing a 5-D view of the bools
        per_row_seen = whole_tissue @ per_column  # (b', P, 5)
        glass = p * p - per_row_seen[..., _GRID].sum(axis=1, dtype=np.float64)
        not_background[unsure] = glass / (p * p) <= max_background_fraction
        # the same 0/1 tile-row -> block matrix as per_column's block columns (blocks are square)
        block_rows = per_column[:, :_GRID].T.astype(np.float64)  # (4, P)
        n_high[unsure] = block_rows @ per_row_seen[..., :_GRID].astype(np.float64)
        votes[unsure] = n_high[unsure] >= quarter
    return not_background, n_high, votes


def _blur_bound(
    sub: np.ndarray, tissue: np.ndarray, seen: np.ndarray, n_high: np.ndarray, votes: np.ndarray
) -> np.ndarray:
    """(B,) a lower bound of each tile's blur score: the median of the voting blocks' variance bounds
    (the whole tile's bound where no block votes), from the sampled rows' Laplacian."""
    b, p = sub.shape[0], sub.shape[2]
    t = sub.shape[1] // 3
    _, _, per_centre, per_column, _ = _layout(p)
    # the Laplacian at the centre rows, over tissue pixels: exact in integers per channel, then weighted
    # as the grayscale is (the Laplacian is linear; it differs from the exact filter's, which rounds the
    # grayscale first, by under 0.01 a pixel, far inside MARGIN), a third of the float work
    rgb = sub.reshape(b, t, 3, p * 3).astype(np.int16)  # (B, T, 3 rows, P * 3 interleaved channels)
    lap_rgb = rgb[:, :, 1, 3:-3] * np.int16(4)
    lap_rgb -= rgb[:, :, 0, 3:-3]
    lap_rgb -= rgb[:, :, 2, 3:-3]
    lap_rgb -= rgb[:, :, 1, :-6]  # the pixel to the left: 3 values back
    lap_rgb -= rgb[:, :, 1, 6:]
    lap = lap_rgb.reshape(b, t, p - 2, 3).astype(np.float32) @ GRAY  # (B, T, P - 2)
    centre = seen.reshape(b, t, 3, _GRID + 1)[:, :, 1, :_GRID].astype(np.float64)  # (B, T, 4)
    lap *= tissue.reshape(b, t, 3, p)[:, :, 1, 1:-1]
    columns = per_column[1:-1, :_GRID]  # the Laplacian's column j is the tile's j + 1
    m = per_centre @ centre
    s1 = per_centre @ (lap @ columns).astype(np.float64)
    np.square(lap, out=lap)
    s2 = per_centre @ (lap @ columns).astype(np.float64)
    spread = np.maximum(s2 - s1 * s1 / np.maximum(m, 1.0), 0.0)  # sum of squared deviations of the m
    bound = (spread / np.maximum(n_high, 1.0)).reshape(b, -1)  # (B, 16): at most each block's variance
    n_votes = votes.reshape(b, -1).sum(axis=1)
    ranked = np.sort(np.where(votes.reshape(b, -1), bound, np.inf), axis=1)
    rows_b, lo, hi = np.arange(b), np.maximum(n_votes - 1, 0) // 2, n_votes // 2
    median = (ranked[rows_b, lo] + ranked[rows_b, hi]) / 2.0
    # no voting block: the exact filter scores the whole tile (every block's pixels together)
    whole = np.maximum(
        s2.sum(axis=(1, 2)) - s1.sum(axis=(1, 2)) ** 2 / np.maximum(m.sum(axis=(1, 2)), 1.0), 0.0
    ) / np.maximum(n_high.sum(axis=(1, 2)), 1.0)
    return np.where(n_votes > 0, median, whole)


__all__ = ["MARGIN", "STRIDE", "surely_kept"]

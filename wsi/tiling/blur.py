"""The background and blur filters' pixel measures on (B, P, P, 3) uint8 tiles: the near-white share,
the blur score (median block Laplacian variance over tissue pixels) and a coarse scan's source-resolution
blocks. `wsi.tiling.grid.classify_tiles` turns them into verdicts; `wsi.tiling.filter_bounds` bounds them
cheaply.
"""

from __future__ import annotations

import numpy as np

#: luminance weights of the blur filter's grayscale
GRAY = np.array([0.299, 0.587, 0.114], np.float32)
#: tiles per blur computation: keeps the float32 temporaries in cache (measured ~1.5x faster than 32)
BLUR_BATCH = 4


def max_rgb(tiles: np.ndarray) -> np.ndarray:
    """(B, P, P) uint8 largest of R, G, B: the signal of a dark-background (fluorescence-like) tile."""
    return np.maximum(np.maximum(tiles[..., 0], tiles[..., 1]), tiles[..., 2])


def min_rgb(tiles: np.ndarray) -> np.ndarray:
    """(B, P, P) uint8 smallest of R, G, B (a pixel is near-white when even this is high).

    Two np.minimum calls: `tiles.min(axis=-1)` over a length-3 axis is ten times slower.
    """
    return np.minimum(np.minimum(tiles[..., 0], tiles[..., 1]), tiles[..., 2])


def background_fraction(tiles: np.ndarray, *, white_level: int, low: np.ndarray | None = None) -> np.ndarray:
    """(B,) fraction of near-white pixels of (B, P, P, 3) uint8 tiles (`low`: their min_rgb, if known)."""
    low = min_rgb(tiles) if low is None else low
    # count_nonzero: `.mean()` of a bool array converts every pixel to float64 first (5x slower)
    return np.count_nonzero(low >= white_level, axis=(1, 2)) / (low.shape[1] * low.shape[2])


def blur_variance(
    tiles: np.ndarray,
    *,
    white_level: int,
    grid: int = 4,
    low: np.ndarray | None = None,
    dark: bool = False,
    gain: float = 1.0,
) -> np.ndarray:
    """(B,) sharpness score: the median over a `grid` x `grid` split of the tile of the variance of the
    4-neighbour Laplacian of the grayscale image, over non-background pixels.

    The median makes it "mostly blurry": a tile is called blurry when most of its tissue is out of
    focus, however sharp a small part is (one whole-tile variance is dominated by the sharpest strip).
    Background pixels are left out so that a sharp fragment on glass is not called blurry; blocks with
    under a quarter tissue do not vote. A tile with no voting block falls back to its whole-tile value.
    dark: a dark-background slide (`dark_inputs`: brightest channel times `gain`, over signal pixels);
    `low` is then the brightest channel, not the darkest.
    """
    low = (max_rgb(tiles) if dark else min_rgb(tiles)) if low is None else low
    parts = []
    for i in range(0, len(tiles), BLUR_BATCH):
        part, part_low = tiles[i : i + BLUR_BATCH], low[i : i + BLUR_BATCH]
        if dark:
            gray, fg = dark_inputs(part_low, white_level, gain)
        else:
            gray, fg = light_inputs(part, part_low, white_level)
        parts.append(block_median_variance(gray, fg, grid))
    return np.concatenate(parts) if parts else np.zeros(0)


def light_inputs(tiles: np.ndarray, low: np.ndarray, white_level: int) -> tuple[np.ndarray, np.ndarray]:
    """Brightfield: luminance, and tissue = pixels with some channel below `white_level`."""
    return tiles.astype(np.float32) @ GRAY, low < white_level  # (B, P, P) each


def dark_inputs(
    high: np.ndarray, white_level: int, gain: float = 1.0, signal_level: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Dark background (fluorescence-like): the brightest channel (times the slide's `gain`), and tissue
    = pixels with signal, i.e. brighter than 255 - white_level (the mirror of near-white glass).

    Each dye lights one channel, so luminance weights would hide a blue DAPI signal (weight 0.114) and
    the max over channels keeps every dye. Not scaled per tile: blur lowers a tile's peaks, so scaling
    each tile to its own peak would make blurred tiles look sharp; the slide's `gain` (`wsi.tiling.background.
    signal_gain`) brightens a dimly exposed slide as a whole instead.
    """
    fg = high > (255 - white_level if signal_level is None else signal_level)  # (B, P, P)
    gray = high.astype(np.float32)
    if gain != 1.0:
        gray *= np.float32(gain)
    return gray, fg


def block_median_variance(gray: np.ndarray, fg_full: np.ndarray, grid: int) -> np.ndarray:
    """(B,) median over grid x grid blocks of the Laplacian variance of `gray` (B, P, P) over `fg_full`."""
    b, p = gray.shape[:2]
    lap = gray[:, 1:-1, 1:-1] * 4.0  # (B, M, M), M = P-2; in place from here: fewer temporaries
    lap -= gray[:, :-2, 1:-1]
    lap -= gray[:, 2:, 1:-1]
    lap -= gray[:, 1:-1, :-2]
    lap -= gray[:, 1:-1, 2:]
    fg = fg_full[:, 1:-1, 1:-1].astype(np.float32)  # (B, M, M) 1 = tissue pixel
    lap *= fg
    # Block sums as matrix products: blocks (grid, M) @ x (B, M, M) @ blocks.T -> (B, grid, grid).
    # Faster than reshaping into 5-D and reducing, and the last M % grid rows/columns simply drop out.
    m = p - 2
    k = m // grid
    blocks = np.zeros((grid, m), np.float32)
    for i in range(grid):
        blocks[i, i * k : (i + 1) * k] = 1.0
    n = blocks @ fg @ blocks.T
    s1 = blocks @ lap @ blocks.T
    np.square(lap, out=lap)
    s2 = blocks @ lap @ blocks.T
    safe_n = np.maximum(n, 1.0)
    block_var = np.maximum(s2 / safe_n - (s1 / safe_n) ** 2, 0.0).reshape(b, -1)  # (B, grid*grid)
    voting = (n >= 0.25 * k * k).reshape(b, -1)
    n_all = np.maximum(n.reshape(b, -1).sum(1), 1.0)
    whole = np.maximum(s2.reshape(b, -1).sum(1) / n_all - (s1.reshape(b, -1).sum(1) / n_all) ** 2, 0.0)
    score = whole
    k = voting.sum(axis=1)  # (B,) voting blocks per tile; the median of those, as np.median gives it:
    ranked = np.sort(np.where(voting, block_var, np.inf), axis=1)  # the k voting values first
    rows, lo, hi = np.arange(b), np.maximum(k - 1, 0) // 2, k // 2
    median = (ranked[rows, lo] + ranked[rows, hi]) / np.float32(2)  # odd k: lo == hi
    score = np.where(k > 0, median, score)  # tiles with no voting block keep the whole-tile value
    return np.where(n.reshape(b, -1).sum(1) > 0, score, 0.0)


def source_blocks(tiles: np.ndarray, k: int) -> np.ndarray:
    """(B, P//k, P//k, 3) uint8 means of k x k blocks of (B, P, P, 3) tiles (the last P % k px dropped)."""
    b, p = tiles.shape[:2]
    m = p // k
    blocks = tiles[:, : m * k, : m * k].reshape(b, m, k, m, k, 3).astype(np.float32).mean(axis=(2, 4))
    return np.rint(blocks).astype(np.uint8)


def blur_reduction(slide_mpp: float, target_mpp: float, tile_px: int) -> int:
    """k for `classify_tiles(blur_reduce=)`: the whole upsampling factor of a scan coarser than the tiles
    (1 when it is not), at most tile_px // 16 so that the blur test keeps 16 px a side."""
    factor = slide_mpp / target_mpp
    if factor < 1.5:
        return 1
    return max(1, min(round(factor), tile_px // 16))


__all__ = [
    "BLUR_BATCH", "GRAY", "background_fraction", "block_median_variance", "blur_reduction", "blur_variance",
    "dark_inputs", "light_inputs", "max_rgb", "min_rgb", "source_blocks",
]  # fmt: skip

"""The dark background's own noise level: where signal starts on a fluorescence-like slide.

A fixed brightness floor misses a dimly exposed scan (a TRITC channel whose tissue sits at 15-20 of 255
on a background of 5 is all "nothing" above 25), and Otsu on a slide with a few bright nuclei splits the
nuclei from everything else. What separates tissue from glass on such a scan is the background's noise:
the background is the most common brightness (the histogram's mode), and the pixels darker than the mode
are background alone (tissue only adds light), so their spread about the mode is the noise, sigma. Signal
is whatever is more than `k` sigma above the mode (4 sigma: about 3 pixels in 100,000 of pure noise,
which the mask's cleanup of small regions removes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: the least noise assumed (grey levels): a constant background (generated slides, a clipped sensor) has
#: none, and one grey level is the quantisation step of 8-bit pixels
MIN_SIGMA = 1.0


@dataclass(frozen=True)
class DarkNoise:
    """The background level of a dark slide, its noise and the signal threshold (0-255 grey levels)."""

    background: float  # the mode of the brightest channel
    sigma: float  # noise: RMS of the pixels below the mode about it, at least MIN_SIGMA
    threshold: float  # background + k * sigma: brighter is signal

    def describe(self) -> str:
        return f"background {self.background:.0f} +- {self.sigma:.1f}, signal above {self.threshold:.1f}"


def dark_noise(high: np.ndarray, *, k: float) -> DarkNoise:
    """The noise model of a dark-background image from `high` (any shape, uint8: brightest channel)."""
    values = np.asarray(high, dtype=np.uint8).ravel()
    if values.size == 0:
        return DarkNoise(0.0, MIN_SIGMA, k * MIN_SIGMA)
    hist = np.bincount(values, minlength=256).astype(np.float64)
    # a 3-bin smoothing keeps a flat, noisy background peak from being split by one JPEG-loved level
    smooth = np.convolve(hist, np.ones(3), mode="same")
    peak = int(np.argmax(smooth))
    low = max(0, peak - 1)
    mode = low + int(np.argmax(hist[low : peak + 2]))  # the peak's own highest level
    levels = np.arange(mode + 1, dtype=np.float64)
    below = hist[: mode + 1]
    n = float(below.sum())
    sigma = math.sqrt(float((below * (mode - levels) ** 2).sum()) / n) if n > 0 else 0.0
    sigma = max(sigma, MIN_SIGMA)
    return DarkNoise(float(mode), sigma, float(mode) + k * sigma)


def tile_signal_level(noise: DarkNoise, tissue_level: float, *, ceiling: int) -> int:
    """The brightness (0-255) above which a pixel of a full-resolution tile is signal.

    The thumbnail averages the noise away, so its threshold is too low for tile pixels; halfway between
    the background and the tissue's median brightness (both measured on the thumbnail) holds at any
    resolution where the noise is under half the tissue's contrast. Never above `ceiling` (255 -
    white_level, the level of a well exposed slide) nor under the thumbnail's own threshold.
    """
    middle = (noise.background + tissue_level) / 2.0
    return int(min(float(ceiling), max(noise.threshold, middle)))


__all__ = ["MIN_SIGMA", "DarkNoise", "dark_noise", "tile_signal_level"]

"""One dataset sample, typed: what every input's torch Dataset yields and the training loop, the patient
join (`wsi.pipelines.study.cases`), heatmaps and top tiles read by key.

Feature bags give `x` (N, D) with tile positions in micrometres (`coords_um`, `tile_um`) or, for a
pixel-layout bag of unknown resolution, in level-0 pixels (`coords_px`, `tile_px0`); images give
`x` (C, H, W) or (C, D, H, W) only, and an unreadable image gives `error` instead of `x`. Cases add the
target vector and, for a patient, where each slide's tiles sit in the joined bag (`parts`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Required, TypedDict

if TYPE_CHECKING:
    import torch


class SlidePart(TypedDict):
    """One slide of a patient's joined bag: its rows [start, stop) and how far it was moved along x."""

    id: str
    path: Path
    start: int
    stop: int
    shift_um: float


class Sample(TypedDict, total=False):
    label: Required[int]  # class index (-1: unknown)
    id: Required[str]  # the item's id (slide, patient or image)
    x: torch.Tensor  # bags (N, D); images (C, H, W) | (C, D, H, W); absent when `error`
    error: str  # an unreadable image: the reader's message
    coords_um: torch.Tensor  # (N, 2) float32 tile top-left, micrometres
    tile_um: float | None
    coords_px: torch.Tensor  # (N, 2) level-0 px, when the resolution is unknown (no coords_um)
    tile_px0: float | None
    target: torch.Tensor  # (T,) float32 target vector, NaN = missing (added by the cases)
    parts: list[SlidePart]  # a patient's slides in its joined bag


__all__ = ["Sample", "SlidePart"]

"""Training augmentation for images, as in the paper (never applied to whole slides).

2D: a rotation drawn uniformly within +/-45 degrees, then a vertical flip with probability 0.5.
3D: a flip along each spatial axis (depth, height, width), each with probability 0.5.
Every draw comes from the given `torch.Generator`, so a seed fixes the augmentation exactly.
Rotated-in corners are filled with 0, the mean after `transforms.normalize_intensity`.
"""

from __future__ import annotations

import torch

MAX_ROTATION_DEG = 45.0
FLIP_P = 0.5


def _coin(generator: torch.Generator | None, p: float) -> bool:
    return bool(torch.rand((), generator=generator) < p)


def draw_2d(
    generator: torch.Generator | None = None, *, max_rotation_deg: float = MAX_ROTATION_DEG
) -> tuple[float, bool]:
    """(rotation angle in degrees, vertical flip?) for one 2D sample."""
    angle_deg = float((torch.rand((), generator=generator) * 2.0 - 1.0) * max_rotation_deg)
    return angle_deg, _coin(generator, FLIP_P)


def apply_2d(x: torch.Tensor, angle_deg: float, vflip: bool) -> torch.Tensor:
    """(C, H, W) rotated counter-clockwise by `angle_deg` about the centre, then flipped upside down."""
    if angle_deg:
        # imported here: torchvision costs ~160 MB of memory, which a slide prediction never needs
        from torchvision.transforms.v2 import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        x = TF.rotate(x, angle_deg, interpolation=InterpolationMode.BILINEAR, fill=0.0)
    return x.flip(-2) if vflip else x  # flip(-2): rows reversed


def augment_2d(
    x: torch.Tensor, generator: torch.Generator | None = None, *, max_rotation_deg: float = MAX_ROTATION_DEG
) -> torch.Tensor:
    """(C, H, W) -> (C, H, W): random rotation in [-max, +max] degrees, then vertical flip (p=0.5)."""
    return apply_2d(x, *draw_2d(generator, max_rotation_deg=max_rotation_deg))


def draw_3d(generator: torch.Generator | None = None) -> tuple[int, ...]:
    """The spatial axes (-3 = D, -2 = H, -1 = W) to flip for one volume, each with p=0.5."""
    return tuple(axis for axis in (-3, -2, -1) if _coin(generator, FLIP_P))


def augment_3d(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """(C, D, H, W) -> (C, D, H, W): flip along each of D, H, W independently with p=0.5."""
    axes = draw_3d(generator)
    return x.flip(axes) if axes else x

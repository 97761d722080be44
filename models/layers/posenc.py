"""Fixed sine-cosine position encodings: from tile coordinates in micrometres, or from a patch grid.

Fixed (not learned) so that any slide size or image size works without interpolation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsi.core.errors import ConfigError


def sincos(positions: Tensor, dim: int, temperature: float = 10000.0) -> Tensor:
    """positions (..., A) in arbitrary units -> (..., dim) encoding.

    Each of the A axes gets 2 * (dim // (2A)) channels (sin and cos at geometric frequencies); any
    remaining channels are zero.
    """
    axes = positions.shape[-1]
    freqs = dim // (2 * axes)
    if freqs < 1:
        raise ConfigError(f"position encoding of {axes} axes needs dim >= {2 * axes}, got {dim}")
    omega = temperature ** (-torch.arange(freqs, dtype=torch.float32, device=positions.device) / freqs)
    angles = positions.float().unsqueeze(-1) * omega  # (..., A, F)
    enc = torch.cat([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (..., A * 2F)
    return torch.nn.functional.pad(enc, (0, dim - enc.shape[-1]))  # (..., dim)


def sincos_from_coords_um(coords_um: Tensor, dim: int, unit_um: float) -> Tensor:
    """Tile top-left coordinates (..., 2) in micrometres -> (..., dim); one unit = `unit_um`."""
    if coords_um.shape[-1] != 2:
        raise ConfigError(f"coords_um must end in 2 (x, y) micrometres, got shape {tuple(coords_um.shape)}")
    return sincos(coords_um.float() / float(unit_um), dim)


def sincos_grid(grid_shape: tuple[int, ...], dim: int, device: torch.device | None = None) -> Tensor:
    """Row-major patch grid (h, w) or (d, h, w) -> (prod(grid), dim), positions in patch units."""
    axes = [torch.arange(n, dtype=torch.float32, device=device) for n in grid_shape]
    positions = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(grid_shape))
    return sincos(positions, dim)

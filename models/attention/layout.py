"""Where tokens sit, for gdla's local mixer: neighbour tables from a patch grid or from tile coordinates.

A neighbour table is (B or 1, N, T) int64: for each token, the index of the token in each of the T cells
of its 3x3 (T = 9) or 3x3x3 (T = 27) neighbourhood, centre included (`CENTRE[ndim]`), or -1 for an empty
cell. Cost is linear in the number of tokens (a sort and a binary search per tap): no N x N and no
dense grid is ever formed, so a slide whose tiles span 390 x 390 cells costs what its tiles cost.

Slide tiles lie on a regular grid of pitch `grid_um` (the tile size, or the stride of overlapping
tiles): cell = round((coords_um - min) / grid_um). Given no pitch, it is read off the bag as the
smallest gap between distinct x or y coordinates. Tokens off the grid (a class token, padding) have
no neighbours: only their centre cell, themselves.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from wsi.core.errors import ConfigError

# Tap offsets in row-major order ((-1, -1), (-1, 0), ... (1, 1)); the centre tap is the middle one.
OFFSETS = {nd: torch.tensor(list(itertools.product((-1, 0, 1), repeat=nd))) for nd in (2, 3)}
CENTRE = {nd: len(OFFSETS[nd]) // 2 for nd in (2, 3)}


def isolated(n_tokens: int, ndim: int = 2, device: torch.device | None = None) -> Tensor:
    """(1, N, T) table of tokens without neighbours: -1 everywhere but the centre (the token itself)."""
    table = torch.full((1, n_tokens, len(OFFSETS[ndim])), -1, dtype=torch.long, device=device)
    table[0, :, CENTRE[ndim]] = torch.arange(n_tokens, device=device)
    return table


def grid_neighbours(grid_shape: tuple[int, ...], n_tokens: int, device: torch.device | None = None) -> Tensor:
    """Table (1, N, T) for tokens whose LAST prod(grid_shape) form a row-major grid (leading: isolated)."""
    ndim, cells = len(grid_shape), math.prod(grid_shape)
    if ndim not in OFFSETS or cells > n_tokens:
        raise ConfigError(
            f"grid {tuple(grid_shape)} does not fit {n_tokens} tokens (2 or 3 axes, at most N cells)"
        )
    lead = n_tokens - cells
    pos = torch.stack(torch.meshgrid(*[torch.arange(s) for s in grid_shape], indexing="ij"), -1)
    pos = pos.reshape(cells, 1, ndim) + OFFSETS[ndim]  # (cells, T, ndim) neighbour positions
    size = torch.tensor(grid_shape)
    inside = ((pos >= 0) & (pos < size)).all(-1)  # (cells, T)
    strides = torch.tensor([math.prod(grid_shape[i + 1 :]) for i in range(ndim)])
    flat = torch.where(inside, (pos * strides).sum(-1) + lead, -1)  # (cells, T) token indices
    table = isolated(n_tokens, ndim)
    table[0, lead:] = flat
    return table.to(device)


def infer_grid_um(coords_um: Tensor) -> float:
    """Grid pitch of one bag's tile coordinates (n, 2): the smallest gap between distinct x or y values."""
    gaps = []
    for axis in range(coords_um.shape[1]):
        values = torch.unique(coords_um[:, axis].double())  # sorted
        step = values.diff()
        tol = 1e-6 * float(values.abs().max()) + 1e-3 if len(values) else 0.0
        step = step[step > tol]
        if len(step):
            gaps.append(float(step.min()))
    return min(gaps) if gaps else 1.0  # a single row and column: any pitch puts the tiles apart


@dataclass
class TileLayout:
    """Tiles of a batch of bags on their grids.

    `order` (B, N): token indices in raster order (grid row by row), padding last. `neighbours`
    (B, N, 9): for the token at raster position j, the RASTER positions of its neighbours (-1: empty
    cell); chunks taken in raster order then need only one grid row of neighbours on either side.
    """

    order: Tensor
    neighbours: Tensor

    def in_token_order(self) -> Tensor:
        """The neighbour table indexed and valued by the tokens' own positions: (B, N, 9)."""
        table = torch.where(
            self.neighbours >= 0,
            self.order.gather(1, self.neighbours.clamp_min(0).flatten(1)).view_as(self.neighbours),
            -1,
        )
        out = torch.empty_like(table)
        out.scatter_(1, self.order.unsqueeze(-1).expand_as(table), table)
        return out

    def with_leading(self, leading: int) -> TileLayout:
        """The same layout behind `leading` isolated tokens (a class token first): (B, leading + N, ...)."""
        b = self.neighbours.shape[0]
        head = isolated(leading, 2, self.neighbours.device).expand(b, -1, -1)
        shifted = torch.where(self.neighbours >= 0, self.neighbours + leading, -1)
        order = torch.arange(leading, device=self.order.device).expand(b, -1)
        return TileLayout(torch.cat([order, self.order + leading], 1), torch.cat([head, shifted], 1))


def tile_layout(coords_um: Tensor, mask: Tensor | None = None, grid_um: float | None = None) -> TileLayout:
    """Raster order and 3x3 neighbours of the tiles of each bag; coords_um (B, N, 2) top-left micrometres.

    Padded tiles (mask False / weight 0) are placed last and have no neighbours. Two tiles that round
    to the same cell (tiles overlapping by more than half) are both kept; a neighbour lookup finds one.
    """
    if coords_um.ndim != 3 or coords_um.shape[-1] != 2:
        raise ConfigError(f"coords_um must be (B, N, 2) micrometres, got shape {tuple(coords_um.shape)}")
    if grid_um is not None and grid_um <= 0:
        raise ConfigError(f"grid_um must be positive, got {grid_um}")
    b, n, _ = coords_um.shape
    offsets = OFFSETS[2].to(coords_um.device)
    order = torch.empty(b, n, dtype=torch.long, device=coords_um.device)
    table = isolated(n, 2, coords_um.device).repeat(b, 1, 1)
    for i in range(b):
        real = torch.ones(n, dtype=torch.bool, device=coords_um.device) if mask is None else mask[i] > 0
        idx = real.nonzero().view(-1)  # tokens on the grid
        order[i] = torch.cat([idx, (~real).nonzero().view(-1)])
        if len(idx) == 0:
            continue
        c = coords_um[i, idx].double()
        pitch = grid_um or infer_grid_um(c)
        cell = torch.round((c - c.min(0).values) / pitch).long()  # (n, 2) x, y
        stride = int(cell[:, 0].max()) + 3  # room for x - 1 and x + 1 without wrapping into a row
        key = (cell[:, 1] + 1) * stride + cell[:, 0] + 1
        rank = torch.argsort(key, stable=True)  # raster order among the real tiles
        order[i, : len(idx)] = idx[rank]
        sorted_key = key[rank]
        wanted = sorted_key[:, None] + offsets[:, 0] * stride + offsets[:, 1]  # (n, 9): (dy, dx) row-major
        pos = torch.searchsorted(sorted_key, wanted).clamp_max(len(idx) - 1)
        found = sorted_key[pos] == wanted
        rows = torch.where(found, pos, -1)
        rows[:, CENTRE[2]] = torch.arange(len(idx), device=coords_um.device)  # a cell's twin is not "me"
        table[i, : len(idx)] = rows
    return TileLayout(order, table)


__all__ = ["CENTRE", "OFFSETS", "TileLayout", "grid_neighbours", "infer_grid_um", "isolated", "tile_layout"]

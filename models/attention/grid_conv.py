"""The convolutions of GDLA's block around its mixer, on the token grid (Zheng et al., PVT-GDLA;
../shared/papers/002_c0df02e6ea3bd407.txt).

- `GridDWC`: a depthwise 3x3 (3x3x3) convolution with bias over tokens placed by a neighbour table
  (models.layout), through `models.attention.local.depthwise`: empty cells and absent tokens read 0.
- `PreMix`: SiLU(DWC3x3(x)), what the block feeds its mixer instead of x. The paper replaces the
  positional embedding with a 3x3 depth-wise convolution (Figure 2's caption); the authors' released
  block (github.com/xmindflow/gdla @973d374, modules/decoder/gdlam.py, GDLAM.forward) runs
  x -> LayerNorm -> Conv3x3 -> SiLU -> mixer, residual around all of it. One difference, named: that
  Conv3x3 has no `groups`, so it is a DENSE 3x3 convolution (9 D'^2 weights); we follow the paper's
  text (depth-wise, 9 D' weights), as the task asks.
- `MixFFN`: eqs. 29-30, [X^; G] = DWC3x3(SiLU(Conv1x1(X))), Y = Conv1x1(X^ * SiLU(G)); the released
  code (modules/ffn/gmlp.py, GMLP) has both 1x1 convolutions and the DWC as here, the last 1x1 without
  bias, and takes a dropout it never applies. Dropout after the product and the output is ours (as in
  the plain MLP), 0 unless the model sets `dropout`.

Presence weights (float masks, models.attribution) scale a token's row before it enters a neighbour's
convolution, so weight 0 is the bag without the token, as in every attention variant.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wsi.models.attention import weighted
from wsi.models.attention.layout import CENTRE, OFFSETS
from wsi.models.attention.local import depthwise


class GridDWC(nn.Module):
    """Depthwise 3x3 (grid_ndim 2) or 3x3x3 (3) convolution with bias over grid-placed tokens."""

    def __init__(self, channels: int, grid_ndim: int = 2) -> None:
        super().__init__()
        taps = len(OFFSETS[grid_ndim])
        bound = 1.0 / math.sqrt(taps)  # nn.Conv2d's default init for a depthwise kernel (fan_in = taps)
        self.grid_ndim = grid_ndim
        self.weight = nn.Parameter(torch.empty(channels, taps).uniform_(-bound, bound))  # (C, T)
        self.bias = nn.Parameter(torch.empty(channels).uniform_(-bound, bound))

    def forward(self, u: Tensor, mask: Tensor | None, neighbours: Tensor | None) -> Tensor:
        """u (B, M, C) rows, mask (B, M), neighbours (B|1, N, T) rows of u (-1 empty) -> (B, N, C).

        neighbours None: every token alone in its neighbourhood (only the centre tap reads it)."""
        out = depthwise(weighted(u, mask), neighbours, self.weight, CENTRE[self.grid_ndim])
        return out + self.bias.to(out.dtype)


class PreMix(nn.Module):
    """SiLU(DWC3x3(x)): the block's input to the GDLA mixer (after its LayerNorm)."""

    def __init__(self, dim: int, grid_ndim: int = 2) -> None:
        super().__init__()
        self.dwc = GridDWC(dim, grid_ndim)

    def forward(self, x: Tensor, mask: Tensor | None, neighbours: Tensor | None) -> Tensor:
        return F.silu(self.dwc(x, mask, neighbours))


class MixFFN(nn.Module):
    """Mix-FFN (eqs. 29-30): hidden width `hidden` (the paper's d_hidden = 4 d_model: the model's
    mlp_dim), a depthwise 3x3 over the grid between the two pointwise maps, SiLU gate."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0, grid_ndim: int = 2) -> None:
        super().__init__()
        self.pwc1 = nn.Linear(dim, 2 * hidden)  # Conv1x1 of eq. 29
        self.dwc = GridDWC(2 * hidden, grid_ndim)  # DWC3x3 of eq. 29
        self.pwc2 = nn.Linear(hidden, dim, bias=False)  # Conv1x1 of eq. 30 (released code: no bias)
        self.drop = nn.Dropout(dropout)

    def hidden(self, x: Tensor) -> Tensor:
        """SiLU(Conv1x1(X)) (B, M, 2 hidden): the per-token part before the grid convolution."""
        return F.silu(self.pwc1(x))

    def mix(self, u: Tensor, mask: Tensor | None, neighbours: Tensor | None) -> Tensor:
        """`hidden` rows u (B, M, 2 hidden) -> output (B, N, dim) of the N tokens `neighbours` lists."""
        x_hat, gate = self.dwc(u, mask, neighbours).chunk(2, -1)  # eq. 29
        return self.drop(self.pwc2(self.drop(x_hat * F.silu(gate))))  # eq. 30

    def forward(self, x: Tensor, mask: Tensor | None = None, neighbours: Tensor | None = None) -> Tensor:
        return self.mix(self.hidden(x), mask, neighbours)


__all__ = ["GridDWC", "MixFFN", "PreMix"]

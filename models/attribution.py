"""Per-tile attributions of a MIL model's logits: each tile's whole effect, and how much `base` keeps.

`tile_effects` is the first-order leave-one-out effect of every tile: the derivative of each logit with
respect to the tile's presence weight (every attention variant sums over tokens with these weights, so
weight 0 is the bag without the tile and weight 1 the bag itself). Unlike the direct-path
contributions (`model.logit_decomposition`), it follows a tile through everything it touches: the
sequence statistics and normalizers, earlier blocks, the local mixer's neighbours and the MLP. One
forward and one backward pass per class: linear in the number of tiles. Its error against the exact
leave-one-out difference logits(bag) - logits(bag without the tile) is second order in the tile's
share of the bag, O(1/N) relative for a bag of N tiles.

`base_share` reads a `logit_decomposition`: the fraction of the decomposition carried by `base`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from wsi.errors import ConfigError


def tile_effects(
    model: nn.Module,
    x: Tensor,
    mask: Tensor | None = None,
    coords_um: Tensor | None = None,
) -> Tensor:
    """(B, N, C): d logit_c / d presence_i, tile i's first-order leave-one-out effect; 0 at padding.

    `model` is a MIL model (`build_model("vit-wsi", ...)`) in eval mode; x (B, N, in_dim), mask (B, N)
    bool, coords_um (B, N, 2) as for its forward. Long bags recompute their blocks in backward (the
    model's `checkpoint_above_tokens`), so memory stays near one forward pass with gradients.
    """
    if model.training:
        raise ConfigError("tile_effects needs the model in eval mode (dropout off): call model.eval()")
    if mask is not None and mask.dtype != torch.bool:
        raise ConfigError(f"mask must be bool (True = real tile), got {mask.dtype}")
    presence = torch.ones(x.shape[:2], dtype=torch.float32, device=x.device)
    if mask is not None:
        presence = presence.masked_fill(~mask, 0.0)
    presence.requires_grad_(True)
    with torch.enable_grad():
        logits = model(x, presence, coords_um)  # (B, C)
        grads = [
            torch.autograd.grad(logits[:, c].sum(), presence, retain_graph=c + 1 < logits.shape[1])[0]
            for c in range(logits.shape[1])
        ]
    effects = torch.stack(grads, -1)  # (B, N, C)
    return effects if mask is None else effects.masked_fill(~mask.unsqueeze(-1), 0.0)


def base_share(contrib: Tensor, base: Tensor) -> Tensor:
    """(B, C): |base| / (|base| + sum_i |contrib_i|) of a `logit_decomposition`, in [0, 1].

    1 means the tiles' direct-path terms explain nothing of the logit and a heatmap of them shows
    little of what the model did; store it beside every heatmap.
    """
    if contrib.ndim != 3 or base.shape != (contrib.shape[0], contrib.shape[2]):
        raise ConfigError(
            f"expected contrib (B, N, C) and base (B, C), got {tuple(contrib.shape)} and {tuple(base.shape)}"
        )
    carried = base.abs()
    return carried / (carried + contrib.abs().sum(1)).clamp_min(torch.finfo(base.dtype).tiny)


__all__ = ["base_share", "tile_effects"]

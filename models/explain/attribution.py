"""Per-tile attributions of a MIL model's logits: each tile's whole effect, and how much `base` keeps.

`tile_effects` is each tile's leave-one-out effect, logits(bag) - logits(bag without the tile): what
the model does when the tile is gone, through everything the tile touches (sequence statistics and
normalizers, earlier blocks, grid neighbours, the pooling, the final LayerNorm). How it is computed
depends on the model and the bag (`effects_method` says which, or why none is faithful):

- `exact`, ABMIL at any size: its tiles do not see each other before the pooling, so leaving one out
  is a closed form over the pooling weights (linear in N).
- `exact`, transformers up to `exact_max_tiles` tiles: one re-forward per tile with the tile masked
  out, batched (N forwards of N tiles: quadratic, so small bags only).
- `pooled`, pooled transformers (`pool: gated`) with seqnorm or sima attention on larger bags: the
  pooling is left out exactly over the tokens as they are (closed form), and the tile's effect on the
  OTHER tokens is added to first order (the whole gradient minus the pooling's own).
- `gradient`: the first-order effect d logit / d presence_i alone; `auto` uses it only for class-token
  readouts with seqnorm or sima on larger bags (their class token sees the bag through statistics that
  move by O(1/N)). It is wrong where a readout concentrates on few tiles: with pooling weight
  a_k -> 1, d z / d p_k = a_k (h_k - z) -> 0, so the one tile that decides a bag gets an effect near
  zero (issue 22: relative error 0.14 .. 0.99 on vit-wsi-small).

softmax and gdla transformers on bags above `exact_max_tiles` are refused with a message naming the
limit: their first-order terms were not faithful when measured (softmax can concentrate on one tile;
gdla's local path couples a tile to its 8 neighbours with O(1) weight). Measured relative errors
||effects - loo|| / ||loo|| per kind: docs/api.md ("tile_effects"), `benchmarks/tile_effects_error.py`.

`base_share` reads a `logit_decomposition`: the fraction of the decomposition carried by `base`.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from wsi.core.errors import ConfigError
from wsi.models.explain.leave_one_out import pooled_leave_one_out, reforward_leave_one_out

Method = Literal["auto", "exact", "pooled", "gradient"]
EXACT_MAX_TILES = 512  # default bag size up to which transformers get exact leave-one-out


def _kind(model: nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "kind", ""))


def _smooth(model: nn.Module) -> bool:
    """Only seqnorm or sima attention: a tile reaches the others through sequence statistics that move
    by O(1/N) when it leaves, so the first-order term is faithful (softmax can concentrate on one tile;
    gdla's local path and block convolutions couple a tile to its neighbours with O(1) weight: 19-42%
    error measured with the paper's block)."""
    return str(getattr(getattr(model, "config", None), "attention", "")) in ("seqnorm", "sima")


def effects_method(
    model: nn.Module, n_tiles: int, method: Method = "auto", exact_max_tiles: int = EXACT_MAX_TILES
) -> str:
    """The method `tile_effects` uses for a bag of `n_tiles` real tiles; ConfigError when none is faithful."""
    kind = _kind(model)
    if kind not in ("mil", "abmil"):
        raise ConfigError(
            "tile_effects explains MIL models over tile bags (mil, abmil), "
            f"not {kind or type(model).__name__!r}"
        )
    pooled = kind == "abmil" or getattr(model, "pool", None) is not None
    if method == "pooled" and not pooled:
        raise ConfigError("tile_effects: method 'pooled' needs a pooled readout (pool: gated)")
    if kind == "abmil":
        if method == "gradient":
            raise ConfigError("tile_effects: ABMIL's leave-one-out is exact at any size; use method 'auto'")
        return "exact"
    if method != "auto":
        return method
    if n_tiles <= exact_max_tiles:
        return "exact"
    if _smooth(model):
        return "pooled" if pooled else "gradient"
    what = "class-token readout" if not pooled else "pooled readout"
    raise ConfigError(
        f"tile_effects: a bag of {n_tiles} tiles is above exact_max_tiles={exact_max_tiles}, and for a "
        f"{model.config.attention} transformer with {what} no cheaper method was faithful when measured "  # type: ignore[union-attr]
        "(docs/api.md, tile_effects); raise exact_max_tiles (cost: one forward per tile) or pass "
        "method='gradient' to accept first-order effects"
    )


def tile_effects(
    model: nn.Module,
    x: Tensor,
    mask: Tensor | None = None,
    coords_um: Tensor | None = None,
    *,
    method: Method = "auto",
    exact_max_tiles: int = EXACT_MAX_TILES,
) -> Tensor:
    """(B, N, C): logits(bag) - logits(bag without tile i) for every tile i; 0 at padding.

    `model` is a MIL model (`build_model("vit-wsi" | "vit-wsi-small" | "abmil", ...)`) in eval mode;
    x (B, N, in_dim), mask (B, N) bool, coords_um (B, N, 2) as for its forward. `method`: see the module
    docstring; `auto` is exact where that is cheap, else the measured-faithful approximation, else a
    ConfigError naming the limit.
    """
    if model.training:
        raise ConfigError("tile_effects needs the model in eval mode (dropout off): call model.eval()")
    if mask is not None and mask.dtype != torch.bool:
        raise ConfigError(f"mask must be bool (True = real tile), got {mask.dtype}")
    n_tiles = x.shape[1] if mask is None else int(mask.sum(1).max()) if mask.numel() else 0
    chosen = effects_method(model, n_tiles, method, exact_max_tiles)
    if chosen == "gradient":
        effects = _gradient(model, x, mask, coords_um)
    elif chosen == "pooled":
        effects = _pooled_corrected(model, x, mask, coords_um)
    elif _kind(model) == "abmil":
        effects = _abmil_exact(model, x, mask)
    else:
        effects = reforward_leave_one_out(model, x, mask, coords_um)
    return effects if mask is None else effects.masked_fill(~mask.unsqueeze(-1), 0.0)


def _presence(x: Tensor, mask: Tensor | None) -> Tensor:
    presence = torch.ones(x.shape[:2], dtype=torch.float32, device=x.device)
    return presence if mask is None else presence.masked_fill(~mask, 0.0)


def _grads(logits: Tensor, presence: Tensor, retain_last: bool = False) -> Tensor:
    """(B, N, C): d logits[:, c] / d presence for every class."""
    c = logits.shape[1]
    grads = [
        torch.autograd.grad(logits[:, k].sum(), presence, retain_graph=retain_last or k + 1 < c)[0]
        for k in range(c)
    ]
    return torch.stack(grads, -1)


def _gradient(model: nn.Module, x: Tensor, mask: Tensor | None, coords_um: Tensor | None) -> Tensor:
    """First order: d logit_c / d presence_i (every variant sums over tokens with presence weights)."""
    if _kind(model) == "abmil":
        raise ConfigError("tile_effects: ABMIL takes bool masks only; use method 'auto' (exact at any size)")
    presence = _presence(x, mask).requires_grad_(True)
    with torch.enable_grad():
        return _grads(model(x, presence, coords_um), presence)


def _abmil_exact(model: Any, x: Tensor, mask: Tensor | None) -> Tensor:
    """ABMIL: logits - head(z without tile i), z from the pooling's closed form (exact, linear in N)."""
    present = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
    with torch.no_grad():
        h = model._embed(x, mask)  # (B, N, hidden)
        z_loo = pooled_leave_one_out(h, model.pool.scores(h), present)  # (B, N, hidden) float64
        head = model.head
        loo = z_loo @ head.weight.double().T + head.bias.double()  # (B, N, C)
        full = model(x, mask).double()
    return (full[:, None] - loo).to(head.weight.dtype)


def _pooled_corrected(model: Any, x: Tensor, mask: Tensor | None, coords_um: Tensor | None) -> Tensor:
    """Pooled transformers: exact leave-one-out through the pooling over the tokens as they are, plus
    the tile's first-order effect on the other tokens (the whole gradient minus the pooling's own)."""
    presence = _presence(x, mask).requires_grad_(True)
    present = presence.detach() > 0
    with torch.enable_grad():
        h = model.tile_tokens(x, presence, coords_um)  # (B, N, dim), tiles after the last block
        logits = model.readout(h, presence)
        through_pool = model.readout(h.detach(), presence)  # the same logits, tokens held fixed
        context = _grads(logits, presence) - _grads(through_pool, presence)
    with torch.no_grad():
        hd = h.detach().masked_fill(~present[..., None], 0.0)
        z_loo = pooled_leave_one_out(hd, model.pool.scores(hd), present)  # (B, N, dim) float64
        loo = model.head(model.norm(z_loo.to(hd.dtype)))  # (B, N, C)
        exact_pool = logits.detach()[:, None] - loo
    return (exact_pool + context.to(exact_pool.dtype)).to(model.head.weight.dtype)


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


__all__ = ["EXACT_MAX_TILES", "Method", "base_share", "effects_method", "tile_effects"]

"""Tile attributions: presence weights mean what they say, `tile_effects` is each tile's leave-one-out
effect, and `base_share` says how much of a decomposition the tiles leave unexplained."""

from __future__ import annotations

import pytest
import torch

from wsi.errors import ConfigError
from wsi.models.attribution import base_share, tile_effects
from wsi.models.presets import build_model

VARIANTS = ["seqnorm", "softmax", "sima", "gdla"]
TINY = {"dim": 32, "attn_dim": 16, "heads": 4, "mlp_dim": 48, "depth": 2, "in_dim": 12, "num_classes": 3}


# the class-token readout (vit-wsi) and gated pooling over tile tokens with LayerScale (vit-wsi-small's)
GATED = {"pool": "gated", "pool_dim": 8, "attn_layer_scale": 0.5}
MODELS = [*VARIANTS, *(f"{v}-gated" for v in VARIANTS)]


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    attention, gated = name.removesuffix("-gated"), name.endswith("-gated")
    return build_model("vit-wsi", attention=attention, **TINY, **(GATED if gated else {})).double().eval()


def _slide(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cells = torch.randperm(20 * 20, generator=g)[:n]
    coords = torch.stack([cells % 20, cells // 20], -1).double()[None] * 256.0  # (1, n, 2) sparse grid
    return torch.randn(1, n, 12, generator=g, dtype=torch.float64), coords


@pytest.mark.parametrize("name", MODELS)
def test_presence_weights_remove_and_duplicate_tiles_exactly(name: str) -> None:
    m = _model(name)
    x, coords = _slide(30)
    w = torch.ones(1, 30, dtype=torch.float64)
    w[0, 4], w[0, 9] = 0.0, 2.0
    keep = [i for i in range(30) if i != 4] + [9]  # tile 4 removed, tile 9 twice
    with torch.no_grad():
        weighted = m(x, w, coords)
        explicit = m(x[:, keep], coords_um=coords[:, keep])
        torch.testing.assert_close(
            m(x, torch.ones_like(w), coords), m(x, coords_um=coords), rtol=0, atol=1e-12
        )
    if name.startswith("gdla"):  # a duplicated tile shares its cell: the local mixer sees a neighbour twice
        keep = [i for i in range(30) if i != 4]
        w[0, 9] = 1.0
        with torch.no_grad():
            weighted, explicit = m(x, w, coords), m(x[:, keep], coords_um=coords[:, keep])
    torch.testing.assert_close(weighted, explicit, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", MODELS)
def test_tile_effects_match_leave_one_out_by_brute_force(name: str) -> None:
    """The true effect of tile i is logits(bag) - logits(bag without tile i): computed here with one
    forward pass per tile, on a depth-2 model whose tiles interact through statistics, normalizers,
    both blocks and (gdla) grid neighbours. tile_effects gets it from one backward pass per class."""
    m = _model(name)
    n = 160
    x, coords = _slide(n, seed=1)
    with torch.no_grad():
        full = m(x, coords_um=coords)
        loo = torch.stack(
            [
                full[0] - m(x[:, torch.arange(n) != i], coords_um=coords[:, torch.arange(n) != i])[0]
                for i in range(n)
            ]
        )  # (N, C)
        contrib = m.tile_contributions(x, coords_um=coords)[0]
    effects = tile_effects(m, x, coords_um=coords)[0]
    err = (effects - loo).norm() / loo.norm()
    # first order: exact up to the curvature of a tile's own removal; gdla's local path couples a
    # tile to its 8 neighbours with O(1) weight, so its second-order part does not shrink with N
    assert err < (0.15 if name.startswith("gdla") else 0.05), (
        f"{name}: relative error {err:.3f} against leave-one-out"
    )
    for c in range(loo.shape[1]):
        corr = torch.corrcoef(torch.stack([effects[:, c], loo[:, c]]))[0, 1]
        assert corr > 0.98, f"{name} class {c}: correlation {corr:.3f}"
        direct = torch.corrcoef(torch.stack([contrib[:, c], loo[:, c]]))[0, 1]
        if name.endswith("-gated"):  # a tile's pooling share follows what it does (0.63 gdla .. 0.98)
            assert direct > 0.5, f"{name} class {c}: direct-path correlation {direct:.3f}"
        else:  # the class token's direct path through the last block's attention is not this
            assert direct < corr - 0.3


def test_tile_effects_are_zero_at_padding_and_ignore_it() -> None:
    m = _model("seqnorm")
    x, coords = _slide(20)
    padded = torch.cat([x, torch.full((1, 5, 12), 7.0, dtype=torch.float64)], 1)
    mask = torch.arange(25)[None] < 20
    eff = tile_effects(m, padded, mask, torch.cat([coords, coords[:, :5]], 1))
    torch.testing.assert_close(eff[:, :20], tile_effects(m, x, coords_um=coords), rtol=0, atol=1e-10)
    assert eff[:, 20:].abs().max() == 0
    with pytest.raises(ConfigError, match="eval"):
        tile_effects(m.train(), x)


def test_base_share_is_the_fraction_base_carries() -> None:
    contrib = torch.tensor([[[1.0, -2.0], [3.0, 0.0]]])  # (1, 2 tiles, 2 classes)
    base = torch.tensor([[-4.0, 0.0]])
    torch.testing.assert_close(base_share(contrib, base), torch.tensor([[0.5, 0.0]]))
    m = _model("sima").float()
    x, _ = _slide(40)
    with torch.no_grad():
        share = base_share(*m.logit_decomposition(x.float()))
    assert share.shape == (1, 3) and bool(((share >= 0) & (share <= 1)).all())
    with pytest.raises(ConfigError, match="contrib"):
        base_share(contrib[0], base)

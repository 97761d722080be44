"""Bags of 1 or 2 tiles (Musk2 has them; so does a biopsy with little tissue), with every model.

Sequence normalisation divides by the spread of a channel over the bag's tokens. The MIL transformer
always adds its class token, so a 1-tile bag is a sequence of two tokens: the spread is never taken over
one token, and each channel of Q, K and V normalises to +-1 (gamma and beta then scale and shift it),
i.e. the tile enters through the signs of its learned projections relative to the class token. The
tests pin what that must give: finite logits, gradients and contributions, logits that still depend on
the tile, and padded batches of tiny bags that equal each bag alone, for every attention variant (with
the class-token readout of vit-wsi, and as the small-cohort preset vit-wsi-small: gated pooling over the
tile tokens, LayerScale, pooling dropout) and for ABMIL (whose softmax over one tile is 1).
"""

from __future__ import annotations

import pytest
import torch

from wsi.models import build_model

VARIANTS = ("seqnorm", "softmax", "sima", "gdla")
SMALL = tuple(f"{v}@vit-wsi-small" for v in VARIANTS)  # the preset itself, at its own widths
MODELS = (*VARIANTS, *SMALL, "abmil")
IN_DIM = 12
TINY_MIL = {"dim": 16, "attn_dim": 16, "heads": 2, "mlp_dim": 16, "depth": 2, "dropout": 0.1}
TINY_ABMIL = {"hidden_dim": 16, "attn_dim": 8, "dropout": 0.25, "attention_dropout": 0.5}


def _model(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if name == "abmil":
        return build_model("abmil", in_dim=IN_DIM, num_classes=2, **TINY_ABMIL)
    if name in SMALL:
        attention, preset = name.split("@")
        return build_model(
            preset, attention=attention, in_dim=IN_DIM, num_classes=2, dropout=0.1, pool_dropout=0.5
        )
    return build_model("vit-wsi", attention=name, in_dim=IN_DIM, num_classes=2, **TINY_MIL)


def _coords(n: int) -> torch.Tensor:
    """(1, n, 2) micrometres on a 256 um grid (gdla's local path reads the grid from them)."""
    i = torch.arange(n, dtype=torch.float32)
    return torch.stack([i % 4, i // 4], dim=-1)[None] * 256.0


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("n_tiles", [1, 2])
def test_tiny_bag_trains_and_predicts_finite_values(name: str, n_tiles: int) -> None:
    model = _model(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    bags = [torch.randn(1, n_tiles, IN_DIM, generator=g) * 3 for _ in range(6)]
    labels = [torch.tensor([i % 2]) for i in range(6)]
    model.train()
    for _step in range(3):
        for x, y in zip(bags, labels, strict=True):
            loss = torch.nn.functional.cross_entropy(model(x, coords_um=_coords(n_tiles)), y)
            opt.zero_grad()
            loss.backward()
            assert torch.isfinite(loss)
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            assert grads and all(torch.isfinite(gr).all() for gr in grads)
            opt.step()
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(x, coords_um=_coords(n_tiles)) for x in bags])
        contrib = model.tile_contributions(bags[0], coords_um=_coords(n_tiles))
    assert torch.isfinite(logits).all() and torch.isfinite(contrib).all()
    assert contrib.shape == (1, n_tiles, 2)
    # the logits still depend on the tile(s): not one constant answer for every tiny bag
    assert logits.std(0).max() > 1e-4


@pytest.mark.parametrize("name", MODELS)
def test_padded_batch_of_tiny_bags_equals_each_bag_alone(name: str) -> None:
    model = _model(name).eval()
    lengths = [1, 2, 7, 1]
    g = torch.Generator().manual_seed(2)
    bags = [torch.randn(n, IN_DIM, generator=g) for n in lengths]
    n_max = max(lengths)
    x = torch.full((len(bags), n_max, IN_DIM), 1e3)  # garbage padding must not leak
    mask = torch.zeros(len(bags), n_max, dtype=torch.bool)
    coords = torch.zeros(len(bags), n_max, 2)
    for i, b in enumerate(bags):
        x[i, : len(b)] = b
        mask[i, : len(b)] = True
        coords[i, : len(b)] = _coords(len(b))[0]
    with torch.no_grad():
        padded = model(x, mask, coords_um=coords)
        padded_contrib = model.tile_contributions(x, mask, coords_um=coords)
        for i, b in enumerate(bags):
            alone = model(b[None], coords_um=_coords(len(b)))
            torch.testing.assert_close(padded[i], alone[0], rtol=1e-4, atol=1e-5)
            contrib = model.tile_contributions(b[None], coords_um=_coords(len(b)))[0]
            torch.testing.assert_close(padded_contrib[i, : len(b)], contrib, rtol=1e-4, atol=1e-5)
            assert torch.all(padded_contrib[i, len(b) :] == 0)


def test_seqnorm_normalises_a_one_tile_bag_over_two_tokens_to_signs() -> None:
    """What seqnorm does with a 1-tile bag, written out: the class token and the tile are the only two
    tokens, each half a gap d apart from their mean in every channel, so the normalised channel is
    +-(d/2) / sqrt(d^2/4 + eps): the sign of the tile's side of the class token wherever |d| is well
    above sqrt(eps), shrunk towards 0 where the two nearly agree; never more than 1 in size, whatever
    the scale of the features."""
    model = _model("seqnorm").eval()
    block = model.transformer.blocks[0]
    attn = block.attn
    tile = torch.randn(1, 1, IN_DIM) * 1e3
    with torch.no_grad():
        tokens, _ = model._tokens(tile, None, None)  # (1, 2, dim): class token + the tile
        h = block.norm1(tokens)
        q, k, v = attn._normalized(h, None)
        raw = attn.to_qkv.weight @ (h[0, 1] - h[0, 0])  # (3 D,) the gap d of Q, K, V per channel
    for part, (t, affine) in enumerate(((q, attn.norm_q), (k, attn.norm_k), (v, attn.norm_v))):
        d = raw[part * attn.inner_dim : (part + 1) * attn.inner_dim]
        expected = (d / 2) / torch.sqrt(d**2 / 4 + attn.eps)  # the tile's normalised value
        centred = (t - affine.beta) / affine.gamma  # (1, 2, D)
        torch.testing.assert_close(centred[0, 1], expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(centred[0, 0], -expected, rtol=1e-4, atol=1e-5)
        assert centred.abs().max() <= 1.0

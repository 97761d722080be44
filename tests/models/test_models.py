"""Transformers and presets: widths, shapes, masks, chunking, checkpointing, contributions."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from tiny_mil import READOUTS, TINY, VARIANTS
from tiny_mil import tiny_mil as _mil

from wsi.core.errors import ConfigError
from wsi.models.base.param_groups import param_groups
from wsi.models.presets import (
    build_model,
    build_model_from_config,
    list_models,
)


def _padded(lengths: list[int], dim: int = 20) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    bags = [torch.randn(n, dim, generator=g) for n in lengths]
    x = torch.full((len(bags), max(lengths), dim), 7.0)  # junk in the padding
    mask = torch.zeros(len(bags), max(lengths), dtype=torch.bool)
    for i, b in enumerate(bags):
        x[i, : len(b)], mask[i, : len(b)] = b, True
    return bags, x, mask


def _direct_path_contributions(
    model: torch.nn.Module, run: Callable[[], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token contributions rebuilt as docs/api.md defines them, from the plain forward's activations.

    The last block's input h and the class token entering the final LayerNorm are captured with hooks
    during `run()`; each token's `query_contributions` term of the last block's attention goes through
    the final LayerNorm at the class token's fixed scale and the head's weight. Returns
    (contrib (B, N, C) without the class token, logits (B, C)).
    """
    seen: dict[str, object] = {}
    last = model.transformer.blocks[-1]
    hooks = [
        last.register_forward_pre_hook(lambda _m, args: seen.update(h=args[0], mask=args[1], grid=args[2])),
        model.norm.register_forward_pre_hook(lambda _m, args: seen.update(y=args[0])),
    ]
    try:
        logits = run()
    finally:
        for hook in hooks:
            hook.remove()
    terms = last.attn.query_contributions(
        last.attn_input(seen["h"], seen["mask"], seen["grid"]), seen["mask"], 0, neighbours=seen["grid"]
    )  # (B, 1+N, D')
    if last.attn_scale is not None:  # LayerScale multiplies the attention term on its way to the residual
        terms = terms * last.attn_scale
    y = seen["y"]  # (B, D') the class token after the last block
    sigma = torch.sqrt(y.var(-1, unbiased=False, keepdim=True) + model.norm.eps)[:, None]  # (B, 1, 1)
    through_ln = (terms - terms.mean(-1, keepdim=True)) / sigma * model.norm.weight  # (B, 1+N, D')
    return (through_ln @ model.head.weight.T)[:, 1:], logits


def test_presets_build_with_the_papers_widths() -> None:
    assert list_models() == [
        "abmil", "clam-mb", "clam-sb", "dsmil", "dtfd", "linear", "mlp", "transmil", "vit-2d", "vit-3d",
        "vit-wsi", "vit-wsi-small",
    ]  # fmt: skip
    with torch.device("meta"):
        mil = build_model("vit-wsi")
        v2 = build_model("vit-2d", in_dim=1, num_classes=5)
        v3 = build_model("vit-3d")
    assert mil.proj.weight.shape == (512, 2048) and len(mil.transformer.blocks) == 2
    blk = mil.transformer.blocks[0]
    assert blk.attn.to_qkv.weight.shape == (3 * 512, 512) and blk.attn.heads == 8
    assert blk.mlp.net[0].weight.shape == (512, 512)
    for vit, channels, patch in ((v2, 1, (16, 16)), (v3, 1, (4, 16, 16))):
        assert vit.patch_embed.weight.shape == (1024, channels, *patch)
        assert len(vit.transformer.blocks) == 8
        attn = vit.transformer.blocks[0].attn
        assert attn.to_qkv.weight.shape == (3 * 512, 1024)  # D' = 1024 -> D = 512
        assert attn.to_out.weight.shape == (1024, 512) and attn.heads == 8
        assert vit.transformer.blocks[0].mlp.net[0].weight.shape == (1024, 1024)
    assert v2.head.weight.shape == (5, 1024)
    assert v2.grid_shape((224, 224)) == (14, 14) and v2.num_patches((2048, 2048)) == 16384
    assert v3.grid_shape((32, 256, 256)) == (8, 16, 16)
    with torch.device("meta"):
        assert v3(torch.empty(2, 1, 32, 256, 256)).shape == (2, 2)  # shapes only, no compute


def test_full_width_models_give_logits_of_the_right_shape() -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        mil = build_model("vit-wsi", num_classes=4).eval()
        assert mil(torch.randn(2, 30, 2048, dtype=torch.float16)).shape == (2, 4)  # float16 bags work
        v3 = build_model("vit-3d", attention="gdla", attention_options={"local": True}).eval()
        assert v3(torch.randn(1, 1, 8, 32, 48)).shape == (1, 2)
        v2 = build_model("vit-2d", attention="sima", in_channels=1, depth=1).eval()
        assert v2(torch.randn(1, 1, 32, 64)).shape == (1, 2)


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"unknown field.*widht"):
        build_model("vit-wsi", widht=3)
    with pytest.raises(ConfigError, match="attention 'nope'"):
        build_model("vit-wsi", attention="nope")
    with pytest.raises(ConfigError, match="divisible by the patch size"):
        build_model("vit-2d", **TINY)(torch.zeros(1, 3, 30, 32))
    with pytest.raises(ConfigError, match=r"\(B, N, 20\)"):
        _mil("seqnorm")(torch.zeros(1, 5, 21))
    with pytest.raises(ConfigError, match=r"torch.bool \(1, 4\)"):  # the wrong shape is named
        _mil("seqnorm")(torch.zeros(1, 5, 20), torch.ones(1, 4, dtype=torch.bool))
    for option, field in (("inner_dim", "attn_dim"), ("dropout", "dropout")):  # config_dict must not lie
        with pytest.raises(ConfigError, match=rf"{option}.*{option} -> {field}"):
            build_model("vit-wsi", attention_options={option: 8})
        with pytest.raises(ConfigError, match=option):
            build_model("vit-2d", attention="gdla", attention_options={option: 0.1})
    with pytest.raises(ConfigError, match="grid_um"):
        build_model("vit-wsi", grid_um=0)
    with pytest.raises(ConfigError, match=r"field 'depth'.*got True"):  # a bool is not a width
        build_model("vit-wsi", depth=True)
    with pytest.raises(ConfigError, match=r"pool_dropout.*pool: gated"):  # would be silently ignored
        build_model("vit-wsi", pool_dropout=0.1)


def test_config_dict_rebuilds_the_same_model() -> None:
    m = _mil("gdla", pos_encoding=True)
    clone = build_model_from_config(m.config_dict())
    clone.load_state_dict(m.state_dict())
    x, c = torch.randn(1, 9, 20), torch.rand(1, 9, 2) * 5000
    with torch.no_grad():
        torch.testing.assert_close(clone(x, coords_um=c), m(x, coords_um=c))


@pytest.mark.parametrize("readout", READOUTS)
@pytest.mark.parametrize("name", VARIANTS)
def test_mil_padded_batch_equals_each_bag_and_ignores_order(name: str, readout: str) -> None:
    m = _mil(name, **READOUTS[readout])
    bags, x, mask = _padded([5, 17, 11])
    with torch.no_grad():
        batched = m(x, mask)
        for i, b in enumerate(bags):
            torch.testing.assert_close(batched[i], m(b[None])[0], rtol=0, atol=1e-5)
        perm = torch.randperm(17)
        torch.testing.assert_close(m(bags[1][perm][None]), m(bags[1][None]), rtol=0, atol=1e-5)


def test_position_encoding_uses_coordinates() -> None:
    m = _mil("seqnorm", pos_encoding=True)
    x = torch.randn(1, 12, 20)
    c = torch.rand(1, 12, 2) * 10_000
    perm = torch.randperm(12)
    with torch.no_grad():
        torch.testing.assert_close(m(x[:, perm], coords_um=c[:, perm]), m(x, coords_um=c), rtol=0, atol=1e-5)
        assert not torch.allclose(m(x[:, perm], coords_um=c), m(x, coords_um=c), atol=1e-4)
    with pytest.raises(ConfigError, match="coords_um"):
        m(x)


@pytest.mark.parametrize("readout", READOUTS)
@pytest.mark.parametrize("name", VARIANTS)
def test_nan_padding_does_not_reach_the_logits(name: str, readout: str) -> None:
    m = _mil(name, **READOUTS[readout])
    _, x, mask = _padded([9, 21, 4])
    nan = x.masked_fill(~mask[..., None], float("nan"))
    with torch.no_grad():
        clean = m(x, mask)
        torch.testing.assert_close(m(nan, mask), clean, rtol=0, atol=1e-6)
        torch.testing.assert_close(m(nan, mask, max_tokens_per_chunk=6), clean, rtol=0, atol=1e-5)
        tiles = m.tile_contributions(nan, mask)
    torch.testing.assert_close(tiles, m.tile_contributions(x, mask), rtol=0, atol=1e-6)


@pytest.mark.parametrize("readout", READOUTS)
@pytest.mark.parametrize("name", VARIANTS)
def test_chunked_inference_equals_plain_pass(name: str, readout: str) -> None:
    m = _mil(name, **READOUTS[readout])
    _, x, mask = _padded([40, 23])
    with torch.no_grad():
        plain = m(x, mask)
        for chunk in (7, 16, 1000):
            torch.testing.assert_close(m(x, mask, max_tokens_per_chunk=chunk), plain, rtol=0, atol=1e-5)
    v = build_model("vit-2d", attention=name, **TINY).eval()
    img = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        torch.testing.assert_close(v(img, max_tokens_per_chunk=5), v(img), rtol=0, atol=1e-5)


def test_gdla_local_path_runs_chunked_on_a_patch_grid() -> None:
    """Both of gdla's paths run in the two-pass scheme, chunks smaller than a grid row included."""
    v = build_model("vit-2d", attention="gdla", attention_options={"local": True}, **TINY).eval()
    img = torch.randn(1, 3, 48, 64)  # 3 x 4 patches
    with torch.no_grad():
        plain = v(img)
        for chunk in (2, 4, 7):
            torch.testing.assert_close(v(img, max_tokens_per_chunk=chunk), plain, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["seqnorm", "softmax"])
def test_checkpointing_gives_the_same_outputs_and_gradients(name: str) -> None:
    _, x, mask = _padded([30, 18])
    grads, outs = [], []
    for ckpt in (False, True):
        m = _mil(name, checkpointing=ckpt).train()
        out = m(x, mask)
        out.logsumexp(-1).sum().backward()
        outs.append(out.detach())
        grads.append({k: p.grad.clone() for k, p in m.named_parameters()})
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=1e-6)
    for k, g in grads[0].items():
        torch.testing.assert_close(grads[1][k], g, rtol=1e-5, atol=1e-7, msg=k)


@pytest.mark.parametrize("readout", READOUTS)
@pytest.mark.parametrize("name", VARIANTS)
def test_tile_contributions_add_up_to_the_logits(name: str, readout: str) -> None:
    m = _mil(name, **READOUTS[readout])
    _, x, mask = _padded([25, 14])
    with torch.no_grad():
        logits = m(x, mask)
        contrib, base = m.logit_decomposition(x, mask)
        tiles = m.tile_contributions(x, mask)
    assert contrib.shape == tiles.shape == (2, 25, 3)
    torch.testing.assert_close(base + contrib.sum(1), logits, rtol=0, atol=1e-5)
    assert tiles[1, 14:].abs().max() == 0
    assert tiles[0].abs().sum() > 0
    # base + contrib.sum == logits holds for ANY terms (base absorbs the rest): check the terms themselves
    if readout == "gated":
        _check_pooled_contributions(m, x, mask, tiles)
        return
    with torch.no_grad():
        want, plain_logits = _direct_path_contributions(m, lambda: m(x, mask))
    torch.testing.assert_close(plain_logits, logits)
    torch.testing.assert_close(tiles, want, rtol=0, atol=1e-5)
    assert want[:, :14].abs().amax(1).min() > 1e-4  # non-trivial terms were compared


def _check_pooled_contributions(
    m: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor, tiles: torch.Tensor
) -> None:
    """pool: gated, written out from the definition: the tile tokens after the last block (captured as
    they enter the pooling), their gated-attention weights a (a softmax over each bag's real tiles), the
    pooled z = sum_k a_k h_k and the final LayerNorm at its actual scale sigma(z); tile k's contribution
    is a_k W (gamma * (h_k - mean h_k)) / sigma."""
    seen: dict[str, torch.Tensor] = {}
    hook = m.pool.register_forward_pre_hook(lambda _m, args: seen.update(h=args[0]))
    try:
        with torch.no_grad():
            m(x, mask)
    finally:
        hook.remove()
    h = seen["h"]  # (B, N, D') tile tokens only: the class token is not pooled
    pool = m.pool
    hidden = torch.tanh(h @ pool.attn_v.weight.T + pool.attn_v.bias)
    hidden = hidden * torch.sigmoid(h @ pool.attn_u.weight.T + pool.attn_u.bias)
    scores = (hidden @ pool.attn_w.weight[0]).masked_fill(~mask, float("-inf"))  # (B, N)
    a = torch.softmax(scores, dim=1)
    torch.testing.assert_close(a.sum(1), torch.ones(len(a)))
    z = torch.einsum("bn,bnd->bd", a, h.masked_fill(~mask[..., None], 0.0))  # (B, D')
    sigma = torch.sqrt(z.var(-1, unbiased=False) + m.norm.eps)[:, None, None]  # (B, 1, 1)
    centred = (h - h.mean(-1, keepdim=True)) * m.norm.weight  # (B, N, D')
    want = a[..., None] * (centred @ m.head.weight.T) / sigma  # (B, N, C)
    torch.testing.assert_close(tiles, want.masked_fill(~mask[..., None], 0.0), rtol=0, atol=1e-6)
    assert want[mask].abs().amax(-1).min() > 1e-6  # non-trivial terms were compared


def test_gated_readout_streams_chunk_by_chunk_like_the_in_memory_forward() -> None:
    """`logits_from_chunks` (wsi predict's streaming of huge bags) with pool: gated: the pooling's
    softmax spans every chunk, so reads of 13 rows against model chunks of 5 must equal one pass."""
    m = _mil("seqnorm", **READOUTS["gated"], pos_encoding=True)
    x, c = torch.randn(1, 41, 20), torch.rand(1, 41, 2) * 3000
    reads = [(x[0, i : i + 13], c[0, i : i + 13]) for i in range(0, 41, 13)]
    with torch.no_grad():
        streamed = m.logits_from_chunks(iter(reads), n_tiles=41, max_tokens_per_chunk=5)
        torch.testing.assert_close(streamed, m(x, coords_um=c), rtol=0, atol=1e-5)


def test_layer_scale_scales_the_attention_residual_and_is_not_decayed() -> None:
    """A LayerScale of s adds s * Attn(LN(x)) where the plain block adds Attn(LN(x)): checked by
    rebuilding one block's output by hand; the scale is a per-channel gain, kept out of weight decay."""
    m = _mil("seqnorm", attn_layer_scale=0.25)
    blk = m.transformer.blocks[0]
    assert blk.attn_scale is not None and torch.all(blk.attn_scale == 0.25)
    x = torch.randn(1, 9, TINY["dim"])
    with torch.no_grad():
        y = x + 0.25 * blk.attn(blk.norm1(x), None)
        torch.testing.assert_close(blk(x), y + blk.mlp(blk.norm2(y)))
    _, keep = param_groups(m, 0.05)
    assert {f"transformer.blocks.{i}.attn_scale" for i in range(TINY["depth"])} <= set(keep["names"])
    assert _mil("seqnorm").transformer.blocks[0].attn_scale is None  # the paper's blocks have none
    with pytest.raises(ConfigError, match="attn_layer_scale"):
        build_model("vit-wsi", attn_layer_scale=0.0)


def test_vit_contributions_reshape_to_the_patch_grid() -> None:
    v = build_model(
        "vit-2d", attention="gdla", attention_options={"local": True}, num_classes=3, **TINY
    ).eval()
    img = torch.randn(2, 3, 48, 80)
    with torch.no_grad():
        contrib, base = v.logit_decomposition(img)
        torch.testing.assert_close(base + contrib.sum(1), v(img), rtol=0, atol=1e-5)
        want, _ = _direct_path_contributions(v, lambda: v(img))
    assert contrib.shape == (2, 15, 3)
    assert contrib[0, :, 1].reshape(v.grid_shape(img.shape)).shape == (3, 5)
    torch.testing.assert_close(contrib, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_vit_contributions_sit_at_their_patch_in_the_grid(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Swapping two patches of the image swaps exactly their two cells of the contribution grid.

    The position encoding is off so the model is equivariant to patch order (gdla: local branch off, legacy
    block; the paper's convolves the grid); a transposed or otherwise wrong patch -> token order puts the
    swap in other cells and fails. Which patch scores highest is not a sound property of random weights.
    """
    monkeypatch.setattr(
        "wsi.models.vit.sincos_grid",
        lambda grid, dim, device=None: torch.zeros(math.prod(grid), dim, device=device),
    )
    local_off = {"attention_options": {"local": False}, "gdla_block": "legacy"} if name == "gdla" else {}
    v = build_model("vit-2d", attention=name, num_classes=3, **TINY, **local_off).eval()
    img = torch.randn(1, 3, 48, 80, generator=torch.Generator().manual_seed(2))
    (r1, c1), (r2, c2), p = (0, 1), (2, 3), 16  # grid 3 x 5: rows and columns are not interchangeable
    swapped = img.clone()
    swapped[..., r1 * p : (r1 + 1) * p, c1 * p : (c1 + 1) * p] = img[
        ..., r2 * p : (r2 + 1) * p, c2 * p : (c2 + 1) * p
    ]
    swapped[..., r2 * p : (r2 + 1) * p, c2 * p : (c2 + 1) * p] = img[
        ..., r1 * p : (r1 + 1) * p, c1 * p : (c1 + 1) * p
    ]
    with torch.no_grad():
        grid = v.grid_shape(img.shape)
        before = v.tile_contributions(img)[0].reshape(*grid, 3)  # (3, 5, C)
        after = v.tile_contributions(swapped)[0].reshape(*grid, 3)
        want, _ = _direct_path_contributions(v, lambda: v(swapped))
    torch.testing.assert_close(after.reshape(-1, 3), want[0], rtol=0, atol=1e-5)
    expected = before.clone()
    expected[r1, c1], expected[r2, c2] = before[r2, c2], before[r1, c1]
    torch.testing.assert_close(after, expected, rtol=0, atol=1e-5)
    assert (before[r1, c1] - before[r2, c2]).abs().max() > 1e-3  # the swap is visible

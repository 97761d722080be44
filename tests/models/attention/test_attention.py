"""Attention variants against independent float64 references, masks, order, chunking, contributions."""

from __future__ import annotations

import math

import pytest
import torch
from gdla_reference import ref_gdla

from wsi.core.errors import ConfigError
from wsi.models.attention import LINEAR_VARIANTS, build_attention, list_attention
from wsi.models.attention._masking import count_tokens, masked_mean_var

VARIANTS = ["seqnorm", "softmax", "sima", "gdla"]
DIM, HEADS, INNER = 24, 3, 12  # token width D' != attention width D on purpose


def _module(name: str, **options: object) -> torch.nn.Module:
    torch.manual_seed(0)
    attn = build_attention(name, DIM, HEADS, inner_dim=INNER, **options).double().eval()
    with torch.no_grad():  # move every parameter away from its init so references check them all
        for p in attn.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return attn


def _bag(n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, n, DIM, generator=g, dtype=torch.float64) * 2.0 + 0.5


def _projections(
    attn: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, ...]:
    """x (N, D') -> q, k, v (N, D) straight from the weights (seqnorm has no bias: `bias` stands in)."""
    w = attn.to_qkv.weight
    b = attn.to_qkv.bias if bias is None else bias
    b = torch.zeros(3 * INNER, dtype=x.dtype) if b is None else b
    return tuple(x @ w[i * INNER : (i + 1) * INNER].T + b[i * INNER : (i + 1) * INNER] for i in range(3))


def _heads(t: torch.Tensor) -> list[torch.Tensor]:
    return list(t.split(INNER // HEADS, dim=-1))


def _ref_seqnorm(attn, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Independent reference: normalize over tokens, then ((Q K^T) V) / N per head, the quadratic way."""
    q, k, v = _projections(attn, x, bias)
    n = x.shape[0]

    def norm(t, aff):
        sd = torch.sqrt(t.var(0, unbiased=False) + attn.eps)
        return (t - t.mean(0)) / sd * aff.gamma + aff.beta

    q, k, v = norm(q, attn.norm_q), norm(k, attn.norm_k), norm(v, attn.norm_v)
    out = torch.cat(
        [(qh @ kh.T) @ vh / n for qh, kh, vh in zip(_heads(q), _heads(k), _heads(v), strict=True)], -1
    )
    return out @ attn.to_out.weight.T + attn.to_out.bias


def _ref_sima(attn, x: torch.Tensor) -> torch.Tensor:
    q, k, v = _projections(attn, x)
    q, k = q / q.abs().sum(0), k / k.abs().sum(0)
    out = torch.cat(
        [(qh @ kh.T) @ vh for qh, kh, vh in zip(_heads(q), _heads(k), _heads(v), strict=True)], -1
    )
    return out @ attn.to_out.weight.T + attn.to_out.bias


def _ref_softmax(attn, x: torch.Tensor) -> torch.Tensor:
    q, k, v = _projections(attn, x)
    d = INNER // HEADS
    heads = [
        torch.softmax(qh @ kh.T / math.sqrt(d), -1) @ vh
        for qh, kh, vh in zip(_heads(q), _heads(k), _heads(v), strict=True)
    ]
    return torch.cat(heads, -1) @ attn.to_out.weight.T + attn.to_out.bias


REFERENCES = {"seqnorm": _ref_seqnorm, "sima": _ref_sima, "softmax": _ref_softmax, "gdla": ref_gdla}


def test_registry_lists_every_variant_and_rejects_unknowns() -> None:
    assert list_attention() == sorted(VARIANTS)
    with pytest.raises(ConfigError, match="unknown attention 'flash'"):
        build_attention("flash", 8, 2)
    with pytest.raises(ConfigError, match="no option"):
        build_attention("seqnorm", 8, 2, lambda_init=0.3)
    with pytest.raises(ConfigError, match="not divisible"):
        build_attention("seqnorm", 8, 3)
    assert {"seqnorm", "sima", "gdla"} == LINEAR_VARIANTS


def test_seqnorm_has_no_dead_bias_and_still_loads_checkpoints_that_had_one() -> None:
    """A bias on Q, K or V cancels in the normalization: the new module has none, and an older state
    dict holding one loads (strictly) into the same outputs as the reference computed WITH that bias."""
    attn, x = _module("seqnorm"), _bag(17)
    assert attn.to_qkv.bias is None
    old = dict(attn.state_dict())
    old["to_qkv.bias"] = torch.randn(3 * INNER, dtype=torch.float64) * 5.0
    fresh = build_attention("seqnorm", DIM, HEADS, inner_dim=INNER).double().eval()
    fresh.load_state_dict(old, strict=True)
    with torch.no_grad():
        want = _ref_seqnorm(attn, x[0], bias=old["to_qkv.bias"])
        torch.testing.assert_close(fresh(x)[0], want, rtol=0, atol=1e-9)
    with pytest.raises(ConfigError, match="cancels"):
        build_attention("seqnorm", 8, 2, bias=True)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("n", [3, 40])  # below and above the head width (sima picks its order from it)
def test_matches_quadratic_float64_reference(name: str, n: int) -> None:
    attn, x = _module(name), _bag(n)
    with torch.no_grad():
        got = attn(x)[0]
        want = REFERENCES[name](attn, x[0])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", VARIANTS)
def test_padded_batch_equals_each_bag_alone(name: str) -> None:
    attn = _module(name).float()
    bags = [_bag(n, seed=n).float() for n in (7, 19, 12)]
    x = torch.zeros(3, 19, DIM)
    mask = torch.zeros(3, 19, dtype=torch.bool)
    for i, b in enumerate(bags):
        x[i, : b.shape[1]] = b[0]
        x[i, b.shape[1] :] = 1e3  # garbage in the padding must not leak
        mask[i, : b.shape[1]] = True
    with torch.no_grad():
        padded = attn(x, mask)
        for i, b in enumerate(bags):
            torch.testing.assert_close(padded[i, : b.shape[1]], attn(b)[0], rtol=0, atol=1e-5)
    assert torch.isfinite(padded).all()


@pytest.mark.parametrize("name", VARIANTS)
def test_nan_padding_cannot_leak_into_real_tokens(name: str) -> None:
    """0 * NaN = NaN: padded rows must be zeroed, not weighted by 0, in every sum over tokens."""
    attn = _module(name).float()
    x = _bag(23).float().repeat(2, 1, 1)
    mask = torch.ones(2, 23, dtype=torch.bool)
    mask[1, 13:] = False
    clean = x.masked_fill(~mask[..., None], 0.0)
    nan = x.masked_fill(~mask[..., None], float("nan"))
    with torch.no_grad():
        want = attn(clean, mask)
        torch.testing.assert_close(attn(nan, mask)[mask], want[mask], rtol=0, atol=1e-6)
        terms = attn.query_contributions(nan, mask)
        torch.testing.assert_close(terms, attn.query_contributions(clean, mask), rtol=0, atol=1e-6)
        assert terms[1, 13:].abs().max() == 0
        state = attn.stream_begin()
        chunks = [slice(0, 10), slice(10, 23)]
        for sl in chunks:
            attn.stream_collect(state, nan[:, sl], mask[:, sl])
        chunked = torch.cat([attn.stream_apply(state, nan[:, sl], mask[:, sl]) for sl in chunks], 1)
    torch.testing.assert_close(chunked[mask], want[mask], rtol=0, atol=1e-5)


def test_token_counts_and_masked_stats_stay_exact_in_bfloat16() -> None:
    x = torch.ones(1, 12_345, 2, dtype=torch.bfloat16)
    mask = torch.ones(1, 12_345, dtype=torch.bool)
    n = count_tokens(mask, x)
    assert n.dtype == torch.float32 and n.item() == 12_345  # bfloat16 would round it to 12,352
    assert count_tokens(None, x).item() == 12_345
    mean, var = masked_mean_var(x, mask)
    assert mean.dtype == var.dtype == torch.bfloat16  # stats keep the activation dtype
    assert torch.all(mean == 1) and torch.all(var == 0)


@pytest.mark.parametrize("name", VARIANTS)
def test_masked_attention_runs_in_bfloat16(name: str) -> None:
    attn = _module(name).float()
    x = _bag(30).float().repeat(2, 1, 1)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[0, 17:] = False
    with torch.no_grad():
        want = attn(x, mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the GPU path's mixed precision, on CPU
            mixed = attn(x, mask)
            terms = attn.query_contributions(x, mask)
        pure = attn.to(torch.bfloat16)(x.to(torch.bfloat16), mask)  # a model cast to bfloat16
    assert pure.dtype == torch.bfloat16 and terms.shape == (2, 30, DIM)
    # mean error: gdla's A1 - lambda A2 cancellation amplifies rounding at single tokens (up to ~30%)
    scale = want[mask].abs().mean()
    for got in (mixed, pure):
        assert torch.isfinite(got).all()
        assert (got[mask].float() - want[mask]).abs().mean() < 0.05 * scale


@pytest.mark.parametrize("name", VARIANTS)
def test_order_invariant_without_position_encoding(name: str) -> None:
    attn, x = _module(name), _bag(33)
    perm = torch.randperm(33, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(attn(x[:, perm]), attn(x)[:, perm], rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", VARIANTS)
def test_chunked_two_pass_equals_plain(name: str) -> None:
    attn = _module(name).float()
    x = _bag(50).float().repeat(2, 1, 1)
    mask = torch.ones(2, 50, dtype=torch.bool)
    mask[1, 31:] = False
    chunks = [slice(0, 16), slice(16, 32), slice(32, 48), slice(48, 50)]
    with torch.no_grad():
        plain = attn(x, mask)
        state = attn.stream_begin()
        for sl in chunks:
            attn.stream_collect(state, x[:, sl], mask[:, sl])
        chunked = torch.cat([attn.stream_apply(state, x[:, sl], mask[:, sl]) for sl in chunks], 1)
    torch.testing.assert_close(chunked[mask], plain[mask], rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_query_contributions_sum_to_the_query_output(name: str) -> None:
    attn, x = _module(name), _bag(21).repeat(2, 1, 1)
    mask = torch.ones(2, 21, dtype=torch.bool)
    mask[1, 15:] = False
    with torch.no_grad():
        terms = attn.query_contributions(x, mask, query_index=0)  # (B, N, D')
        out = attn(x, mask)[:, 0]
    torch.testing.assert_close(terms.sum(1) + attn.to_out.bias, out, rtol=0, atol=1e-9)
    assert terms[1, 15:].abs().max() == 0  # padded tokens contribute nothing


def test_seqnorm_contribution_is_q_dot_k_over_n_times_v() -> None:
    attn, x = _module("seqnorm"), _bag(9)
    q, k, v = attn._normalized(x, None)
    d = INNER // HEADS
    want = (
        torch.cat(
            [
                ((q[0, 0, h * d : (h + 1) * d] @ k[0, :, h * d : (h + 1) * d].T) / 9)[:, None]
                * v[0, :, h * d : (h + 1) * d]
                for h in range(HEADS)
            ],
            -1,
        )
        @ attn.to_out.weight.T
    )
    torch.testing.assert_close(attn.query_contributions(x)[0], want, rtol=0, atol=1e-12)


def test_gradients_reach_gamma_and_beta() -> None:
    attn = _module("seqnorm").float().train()
    x = _bag(12).float().repeat(2, 1, 1)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, 8:] = False
    attn(x, mask).pow(2).mean().backward()
    for norm in (attn.norm_q, attn.norm_k, attn.norm_v):
        for p in (norm.gamma, norm.beta):
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_softmax_uses_sdpa_and_matches_with_a_mask() -> None:
    attn = _module("softmax")
    x = _bag(10).repeat(2, 1, 1)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False
    with torch.no_grad():
        out = attn(x, mask)
        torch.testing.assert_close(out[1, :6], _ref_softmax(attn, x[1, :6]), rtol=0, atol=1e-9)
        w = attn.attention_weights(x, mask)  # (B, h, N)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, HEADS, dtype=w.dtype))
    assert w[1, :, 6:].abs().max() == 0


def test_bad_mask_is_a_config_error() -> None:
    """Masks are bool (True = real) or float presence weights; anything else, or a wrong shape, is refused."""
    attn = _module("seqnorm")
    with pytest.raises(ConfigError, match="bool tensor"):
        attn(_bag(5), torch.ones(1, 5, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"\(1, 5\)"):
        attn(_bag(5), torch.ones(1, 4, dtype=torch.bool))

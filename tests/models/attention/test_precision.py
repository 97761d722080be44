"""Half precision: bf16 autocast keeps seqnorm's float32 answer, and a million tokens neither overflow
fp16 nor lose their sums.

The hard case for seqnorm is tokens that share a large common component (LayerNorm(u + s z), s small):
a bf16 projection rounds |E[Q]| * 2^-9 into every token while standardising divides by the small spread,
so the old code was off by 0.23 at s = 0.03 (50,000 tokens). Sums over N tokens (K^T V, sum phi(K))
reach N times a token's size and overflow fp16 (65,504) near 100,000 correlated tokens.
"""

from __future__ import annotations

import pytest
import torch

from wsi.models.attention import build_attention

D, HEADS = 128, 8


def _common_component(s: float, n: int, dim: int = D, seed: int = 1) -> torch.Tensor:
    """LayerNorm(u + s z): one vector u shared by every token plus per-token noise of scale s. (1, N, dim)"""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(dim, generator=g) * 2.0 + 1.0
    z = torch.randn(1, n, dim, generator=g)
    return torch.nn.functional.layer_norm(u + s * z, (dim,))


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize(
    ("name", "s"), [("seqnorm", 1.0), ("seqnorm", 0.1), ("seqnorm", 0.03), ("gdla", 0.03), ("sima", 0.03)]
)
def test_bf16_autocast_keeps_the_float64_answer_on_a_common_component(name: str, s: float) -> None:
    torch.manual_seed(0)
    attn = build_attention(name, D, HEADS).eval()
    x = _common_component(s, 50_000)
    chunks = [slice(0, 20_000), slice(20_000, 50_000)]
    with torch.no_grad():
        want = attn.double()(x.double())
        attn.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            plain = attn(x)
            state = attn.stream_begin()
            for sl in chunks:
                attn.stream_collect(state, x[:, sl], None)
            chunked = torch.cat([attn.stream_apply(state, x[:, sl], None) for sl in chunks], 1)
    assert _rel(plain, want) <= 1e-2, f"{name} s={s}: {_rel(plain, want):.2e}"
    assert _rel(chunked, want) <= 1e-2, f"{name} s={s} chunked: {_rel(chunked, want):.2e}"


def test_seqnorm_in_a_float32_pass_matches_float64_closely_on_the_hard_case() -> None:
    torch.manual_seed(0)
    attn = build_attention("seqnorm", D, HEADS).eval()
    x = _common_component(0.03, 20_000)
    with torch.no_grad():
        assert _rel(attn(x), attn.double()(x.double())) < 1e-5


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["seqnorm", "gdla"])
def test_a_million_tokens_in_fp16_and_bf16_stay_finite_and_close_to_float32(name: str) -> None:
    """Tiny widths, 1,000,000 correlated tokens (a 1000 x 1000 grid for gdla's local path): autocast
    and a module cast to fp16/bf16 both stay within 1e-2 of the float32 output."""
    torch.manual_seed(0)
    attn = build_attention(name, 16, 2).eval()
    x = _common_component(0.3, 1_000_000, dim=16)
    grid = (1000, 1000) if name == "gdla" else None
    with torch.no_grad():
        want = attn(x, grid_shape=grid)
        for dtype in (torch.float16, torch.bfloat16):
            with torch.autocast("cpu", dtype=dtype):
                mixed = attn(x, grid_shape=grid)
            pure = build_attention(name, 16, 2).eval()
            pure.load_state_dict(attn.state_dict())
            pure = pure.to(dtype)(x.to(dtype), grid_shape=grid)
            for label, got in (("autocast", mixed), ("cast", pure)):
                assert torch.isfinite(got).all(), f"{name} {dtype} {label}: not finite"
                assert _rel(got, want) <= 1e-2, f"{name} {dtype} {label}: {_rel(got, want):.2e}"

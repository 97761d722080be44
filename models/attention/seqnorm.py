"""Sequence-normalized softmax-free attention (`seqnorm`).

Q, K and V are each normalized per bag and per channel across the real tokens (zero mean, unit
variance), then scaled and shifted by their own learnable per-channel gamma and beta. Without a softmax
the products reassociate: per head out = Q_j (K_j^T V_j) / N, so only a (d x d) summary per head is ever
formed and time and memory grow linearly with the number of tokens N.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.attention._base import ATTENTION, AttentionBase, StreamState, add_
from models.attention._masking import count_tokens, masked_mean_var, zero_padded


class ChannelAffine(nn.Module):
    """Per-channel gamma and beta applied after normalization; identity at init (softmax weights transfer)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))


@ATTENTION.register("seqnorm")
class SeqNormAttention(AttentionBase):
    """Softmax-free attention with Q, K, V normalized across the sequence; linear in N."""

    def __init__(self, dim: int, heads: int, *, eps: float = 1e-5, **options: object) -> None:
        super().__init__(dim, heads, **options)  # type: ignore[arg-type]
        self.eps = float(eps)
        self.norm_q = ChannelAffine(self.inner_dim)
        self.norm_k = ChannelAffine(self.inner_dim)
        self.norm_v = ChannelAffine(self.inner_dim)

    def _normalize(self, t: Tensor, mask: Tensor | None, affine: ChannelAffine) -> Tensor:
        mean, var = masked_mean_var(t, mask)  # (B, 1, D) each, over real tokens only
        a = affine.gamma * torch.rsqrt(var + self.eps)  # (B, 1, D): gamma * (t - mean) / sd + beta
        return torch.addcmul(affine.beta - mean * a, t, a)  # one (B, N, D) allocation

    def _normalized(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.qkv(x)  # (B, N, D) each
        q = self._normalize(q, mask, self.norm_q)
        # beta makes padded rows non-zero after normalization: zero them so they add nothing to K^T V.
        k = zero_padded(self._normalize(k, mask, self.norm_k), mask)
        v = zero_padded(self._normalize(v, mask, self.norm_v), mask)
        return q, k, v

    def mix(self, x: Tensor, mask: Tensor | None, grid_shape: tuple[int, ...] | None) -> Tensor:
        n = count_tokens(mask, x).unsqueeze(1)  # (B, 1, 1, 1) float32 real tokens per bag
        q, k, v = (self.split(t) for t in self._normalized(x, mask))  # (B, h, N, d) each
        # 1/N is applied to the (d x d) summary rather than the (N x d) output: same result, one
        # small kernel instead of a pass over N (the step is launch-bound on a GPU up to ~32k tokens).
        kv = torch.matmul(k.transpose(-2, -1), v)  # (B, h, d, d) = K_j^T V_j
        kv = (kv / n).to(kv.dtype)  # divided in float32 (exact N), back to the activation dtype
        return self.merge(torch.matmul(q, kv))  # (B, h, N, d) -> (B, N, D): Q_j (K_j^T V_j) / N

    def query_terms(
        self, x: Tensor, mask: Tensor | None, query_index: int, grid_shape: tuple[int, ...] | None
    ) -> Tensor:
        n = count_tokens(mask, x).unsqueeze(1)  # (B, 1, 1, 1) float32
        q, k, v = (self.split(t) for t in self._normalized(x, mask))  # (B, h, N, d)
        w = torch.einsum("bhd,bhnd->bhn", q[:, :, query_index], k).unsqueeze(-1)  # (B, h, N, 1)
        w = (w / n).to(w.dtype)
        return self.merge(w * v)  # (B, N, D): (q . k_i / N) v_i per head

    # --- chunked inference: one pass of float64 sums, then apply ----------------------------------------
    def stream_collect(self, state: StreamState, x: Tensor, mask: Tensor | None) -> None:
        add_(state, "n", count_tokens(mask, x).view(-1))  # (B,)
        kv = []
        for part, name in enumerate("qkv"):
            t = zero_padded(self.project(x, part), mask).double()  # (B, n, D)
            add_(state, f"s_{name}", t.sum(1))  # (B, D)
            add_(state, f"ss_{name}", (t * t).sum(1))  # (B, D)
            if name != "q":
                kv.append(self.split(t))
        add_(state, "s_kv", torch.einsum("bhnd,bhne->bhde", *kv))  # (B, h, d, d) raw K^T V

    def _finish(self, state: StreamState) -> None:
        """Turn the raw sums into the normalized per-head K^T V / N (float64 algebra, exact)."""
        n = state["n"].view(-1, 1)  # (B, 1)
        coef = {}
        for name, affine in (("q", self.norm_q), ("k", self.norm_k), ("v", self.norm_v)):
            mean = state[f"s_{name}"] / n  # (B, D)
            var = (state[f"ss_{name}"] / n - mean * mean).clamp_min(0.0)
            a = affine.gamma.double() * torch.rsqrt(var + self.eps)  # normalized = t * a + c
            coef[name] = (a, affine.beta.double() - a * mean)
        (ak, ck), (av, cv) = coef["k"], coef["v"]
        h = self.heads
        ak, ck, av, cv = (t.view(t.shape[0], h, -1) for t in (ak, ck, av, cv))  # (B, h, d)
        sk = state["s_k"].view(ak.shape)
        sv = state["s_v"].view(av.shape)
        # sum_i (ak*k_i + ck)(av*v_i + cv)^T, expanded so that only raw sums are needed
        kv = ak.unsqueeze(-1) * state["s_kv"] * av.unsqueeze(-2)
        kv = kv + (ak * sk).unsqueeze(-1) * cv.unsqueeze(-2) + ck.unsqueeze(-1) * (av * sv).unsqueeze(-2)
        kv = kv + n.view(-1, 1, 1, 1) * ck.unsqueeze(-1) * cv.unsqueeze(-2)  # (B, h, d, d)
        state["kv_over_n"] = (kv / n.view(-1, 1, 1, 1)).float()
        state["q_affine"] = (coef["q"][0].float().unsqueeze(1), coef["q"][1].float().unsqueeze(1))

    def stream_mix(self, state: StreamState, x: Tensor, mask: Tensor | None) -> Tensor:
        if "kv_over_n" not in state:
            self._finish(state)
        a, c = state["q_affine"]  # (B, 1, D) each
        q = self.split(self.project(x, 0) * a + c)  # (B, h, n, d)
        kv = state["kv_over_n"].to(q.dtype)
        return self.merge(torch.einsum("bhnd,bhde->bhne", q, kv))  # (B, n, D)

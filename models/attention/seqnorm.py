"""Sequence-normalized softmax-free attention (`seqnorm`).

Q, K and V are each normalized per bag and per channel across the real tokens (zero mean, unit
variance), then scaled and shifted by their own learnable per-channel gamma and beta. Without a softmax
the products reassociate: per head out = Q_j (K_j^T V_j) / N, so only a (d x d) summary per head is ever
formed and time and memory grow linearly with the number of tokens N.

Precision. The normalization subtracts each channel's mean, so Q = X W + b and Q - E[Q] = (X - E[X]) W:
the input is centred over the real tokens in float32 BEFORE the projection, and the bias, which cancels,
is not there at all. A bf16 projection then rounds the spread of the tokens, not their shared mean (which
standardising would amplify); variances and the K^T V summary are formed in float32, and K^T V is scaled
by 1/N so the bf16/fp16 product with Q cannot overflow.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from wsi.core.errors import ConfigError
from wsi.models.attention._base import ATTENTION, AttentionBase, StreamState, add_, no_autocast
from wsi.models.attention._masking import count_tokens, masked_mean_var, masked_sum, weighted, zero_padded
from wsi.models.attention.local import LocalRows


class ChannelAffine(nn.Module):
    """Per-channel gamma and beta applied after normalization; identity at init (softmax weights transfer)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))


def stats_dtype(x: Tensor) -> torch.dtype:
    """float32 for half-precision activations, x's own dtype when wider (float64 references)."""
    return torch.promote_types(x.dtype, torch.float32)


@ATTENTION.register("seqnorm")
class SeqNormAttention(AttentionBase):
    """Softmax-free attention with Q, K, V normalized across the sequence; linear in N."""

    qkv_bias = False  # a bias on Q, K or V cancels in the normalization
    dead_keys = ("to_qkv.bias",)  # checkpoints from before the bias was dropped still load

    def __init__(self, dim: int, heads: int, *, eps: float = 1e-5, **options: object) -> None:
        if options.get("bias"):
            raise ConfigError(
                "seqnorm has no Q/K/V bias: it cancels in the normalization over tokens; drop bias=True"
            )
        super().__init__(dim, heads, **options)  # type: ignore[arg-type]
        self.eps = float(eps)
        self.norm_q = ChannelAffine(self.inner_dim)
        self.norm_k = ChannelAffine(self.inner_dim)
        self.norm_v = ChannelAffine(self.inner_dim)

    def _normalize(self, t: Tensor, mask: Tensor | None, affine: ChannelAffine, dtype: torch.dtype) -> Tensor:
        """(B, N, D) centred projection -> gamma * (t - mean) / sd + beta in `dtype` (statistics too)."""
        mean, var = masked_mean_var(t, mask, dtype)  # (B, 1, D) each, over real tokens only
        a = affine.gamma.to(dtype) * torch.rsqrt(var + self.eps)
        return torch.addcmul(affine.beta.to(dtype) - mean * a, t.to(dtype), a)  # one (B, N, D) allocation

    def _normalized(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """Normalized Q, K, V (B, N, D) in float32 (or wider); K weighted, K and V zero at padding."""
        acc = stats_dtype(x)
        mean = masked_sum(x, mask, acc) / count_tokens(mask, x).to(acc)  # (B, 1, D') E[x] over real tokens
        centred = zero_padded(x.to(acc) - mean, mask).to(self.to_qkv.weight.dtype)
        q, k, v = self.qkv(centred)  # (B, N, D) each: Q - E[Q], K - E[K], V - E[V] (no bias)
        q = self._normalize(q, mask, self.norm_q, acc)
        # beta makes padded rows non-zero after normalization: zero them so they add nothing to K^T V.
        k = weighted(self._normalize(k, mask, self.norm_k, acc), mask)
        v = zero_padded(self._normalize(v, mask, self.norm_v, acc), mask)
        return q, k, v

    def mix(self, x: Tensor, mask: Tensor | None, neighbours: Tensor | None) -> Tensor:
        q, k, v = (self.split(t) for t in self._normalized(x, mask))  # (B, h, N, d) each
        n = count_tokens(mask, x).to(k.dtype).unsqueeze(1)  # (B, 1, 1, 1) real tokens per bag
        with no_autocast(x.device):
            kv = torch.matmul(k.transpose(-2, -1), v) / n  # (B, h, d, d) = K_j^T V_j / N in float32
        return self.merge(torch.matmul(q, kv)).to(x.dtype)  # (B, N, D): Q_j (K_j^T V_j) / N

    def query_terms(
        self, x: Tensor, mask: Tensor | None, query_index: int, neighbours: Tensor | None
    ) -> Tensor:
        q, k, v = (self.split(t) for t in self._normalized(x, mask))  # (B, h, N, d)
        n = count_tokens(mask, x).to(k.dtype).unsqueeze(1)  # (B, 1, 1, 1)
        w = torch.einsum("bhd,bhnd->bhn", q[:, :, query_index], k).unsqueeze(-1) / n  # (B, h, N, 1)
        return self.merge(w * v).to(x.dtype)  # (B, N, D): (q . k_i / N) v_i per head

    # --- chunked inference: the bag's mean and covariance of x, then one affine map per token ---------
    def stream_collect(
        self, state: StreamState, x: Tensor, mask: Tensor | None, local: LocalRows | None = None
    ) -> None:
        """Every statistic seqnorm needs is a function of E[x] and Cov[x] (D' x D'), summed in float64."""
        xw = weighted(x, mask).double()  # (B, n, D')
        add_(state, "n", count_tokens(mask, x).view(-1))  # (B,)
        add_(state, "s1", xw.sum(1))  # (B, D')
        add_(state, "s2", torch.einsum("bnd,bne->bde", xw, zero_padded(x, mask).double()))  # (B, D', D')

    def _finish(self, state: StreamState) -> None:
        """out = (x - m) G + c: fold Q's normalization and the per-head K^T V / N into G (D', D) and c (D)."""
        n = state["n"].view(-1, 1)  # (B, 1)
        mean = state["s1"] / n  # (B, D')
        cov = state["s2"] / n.unsqueeze(-1) - mean.unsqueeze(-1) * mean.unsqueeze(-2)  # (B, D', D')
        wq, wk, wv = self.to_qkv.weight.double().chunk(3)  # (D, D') each

        def scale(w: Tensor, affine: ChannelAffine) -> Tensor:  # gamma / sd per channel, (B, D)
            var = torch.einsum("pd,bde,pe->bp", w, cov, w).clamp_min(0.0)  # diag(W Cov W^T)
            return affine.gamma.double() * torch.rsqrt(var + self.eps)

        aq, ak, av = scale(wq, self.norm_q), scale(wk, self.norm_k), scale(wv, self.norm_v)
        cross = torch.einsum("pd,bde,qe->bpq", wk, cov, wv)  # (B, D, D) Cov[K, V]
        h, d = self.heads, self.head_dim
        blocks = cross.view(-1, h, d, h, d).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)  # (B, h, d, d)
        bk, bv = self.norm_k.beta.double().view(h, d), self.norm_v.beta.double().view(h, d)
        kv = ak.view(-1, h, d, 1) * blocks * av.view(-1, h, 1, d) + bk.unsqueeze(-1) * bv.unsqueeze(-2)
        g = (wq.T * aq.unsqueeze(1)).view(-1, wq.shape[1], h, d)  # (B, D', h, d): W_q^T diag(a_q)
        state["G"] = torch.einsum("bphd,bhde->bphe", g, kv).flatten(2)  # (B, D', D)
        state["c"] = torch.einsum("hd,bhde->bhe", self.norm_q.beta.double().view(h, d), kv).flatten(1)
        state["mean"] = mean.unsqueeze(1)  # (B, 1, D')

    def stream_mix(
        self, state: StreamState, x: Tensor, mask: Tensor | None, local: LocalRows | None = None
    ) -> Tensor:
        if "G" not in state:
            self._finish(state)
        acc = stats_dtype(x)
        centred = (x.to(acc) - state["mean"].to(acc)).to(self.to_qkv.weight.dtype)  # (B, n, D')
        out = torch.matmul(centred, state["G"].to(centred.dtype)) + state["c"].to(centred.dtype).unsqueeze(1)
        return out.to(x.dtype)  # (B, n, D)

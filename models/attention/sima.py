"""SimA attention (`sima`): softmax replaced by l1 normalization of Q and K across the tokens.

Q and K are divided per channel by their l1 norm over the (real) tokens; V is untouched and there is no
scale. The product order is picked per call: (Q K^T) V when N is below the head width, Q (K^T V) else.
The l1 norms and K^T V are summed in float32 (a sum over a million half-precision tokens overflows).
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsi.models.attention._base import ATTENTION, AttentionBase, StreamState, add_, no_autocast
from wsi.models.attention._masking import masked_sum, weighted, zero_padded
from wsi.models.attention.local import LocalRows
from wsi.models.attention.seqnorm import stats_dtype


@ATTENTION.register("sima")
class SimAAttention(AttentionBase):
    def __init__(self, dim: int, heads: int, *, eps: float = 1e-6, **options: object) -> None:
        super().__init__(dim, heads, **options)  # type: ignore[arg-type]
        self.eps = float(eps)

    def _l1(self, t: Tensor, mask: Tensor | None) -> Tensor:
        acc = stats_dtype(t)
        return t.to(acc) / masked_sum(t.abs(), mask, acc).clamp_min(self.eps)  # per channel over real tokens

    def _normalized(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.qkv(x)  # (B, N, D)
        # padded K and V rows are zeroed (not just weighted by 0) so NaN/inf padding cannot leak
        q, k = self._l1(q, mask), weighted(self._l1(k, mask), mask)
        return self.split(q), self.split(k), self.split(zero_padded(v, mask).to(k.dtype))  # (B, h, N, d)

    def mix(self, x: Tensor, mask: Tensor | None, neighbours: Tensor | None) -> Tensor:
        q, k, v = self._normalized(x, mask)
        if x.shape[1] < self.head_dim:
            attn = torch.einsum("bhnd,bhmd->bhnm", q, k)  # (B, h, N, N) = Q K^T
            out = torch.einsum("bhnm,bhme->bhne", attn, v)  # (Q K^T) V
        else:
            with no_autocast(x.device):
                kv = torch.einsum("bhnd,bhne->bhde", k, v)  # (B, h, d, d) = K^T V in float32
            out = torch.einsum("bhnd,bhde->bhne", q, kv)  # Q (K^T V)
        return self.merge(out).to(x.dtype)

    def query_terms(
        self, x: Tensor, mask: Tensor | None, query_index: int, neighbours: Tensor | None
    ) -> Tensor:
        q, k, v = self._normalized(x, mask)
        w = torch.einsum("bhd,bhnd->bhn", q[:, :, query_index], k).unsqueeze(-1)  # (B, h, N, 1)
        return self.merge(w * v).to(x.dtype)

    def stream_collect(
        self, state: StreamState, x: Tensor, mask: Tensor | None, local: LocalRows | None = None
    ) -> None:
        q, k, v = (zero_padded(t, mask).double() for t in self.qkv(x))  # (B, n, D)
        kw = weighted(k, mask)
        add_(state, "l1_q", weighted(q.abs(), mask).sum(1))  # (B, D)
        add_(state, "l1_k", kw.abs().sum(1))
        add_(state, "s_kv", torch.einsum("bhnd,bhne->bhde", self.split(kw), self.split(v)))  # raw K^T V

    def stream_mix(
        self, state: StreamState, x: Tensor, mask: Tensor | None, local: LocalRows | None = None
    ) -> Tensor:
        if "kv" not in state:
            l1_k = state["l1_k"].clamp_min(self.eps).view(-1, self.heads, self.head_dim, 1)
            state["kv"] = state["s_kv"] / l1_k  # (B, h, d, d) = K_hat^T V
            state["inv_l1_q"] = (1.0 / state["l1_q"].clamp_min(self.eps)).unsqueeze(1)  # (B, 1, D)
        q = self.split(self.project(x, 0) * state["inv_l1_q"].to(x.dtype))  # (B, h, n, d)
        return self.merge(torch.einsum("bhnd,bhde->bhne", q, state["kv"].to(q.dtype))).to(x.dtype)

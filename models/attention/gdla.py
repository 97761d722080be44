"""Gated differential linear attention (`gdla`), both paths of the paper (Zheng et al., CVPR 2026
Findings, arXiv 2603.02727, sections 3.3-3.4).

One projection gives Q, K, V and a gate input G (each D wide). The GLOBAL path is a gated differential
linear attention: per head, Q and K split into two halves mapped by phi(x) = ELU(x) + 1; two normalized
linear attentions share V, A_i = phi(Q_i) (phi(K_i)^T V) / (phi(Q_i) sum_n phi(K_i)), and
Y = RMSNorm(A_1 - lambda * A_2) * sigmoid(G), lambda learnable per head and channel. The LOCAL path
first mixes [Q; K; V; G] with its token neighbours, f = PWC(DWC3x3(.)) (a depthwise 3x3 convolution on
the token grid, then a pointwise 4D x 4D projection), and runs a second gated differential linear
attention on the mixed tensors with its own lambda'. The two outputs are concatenated and fused by a
2D x D' projection. Everything is linear in the number of tokens.

Where the paper's equations could not be read here, the authors' released code was the reference:
github.com/xmindflow/gdla, modules/attn/gdla.py (one DWC and one PWC over the stacked 4D channels, one
RMSNorm weight shared by heads and both paths, the gate applied per path). Tokens without a grid
position (a class token, a bag without coordinates) have no neighbours: only their centre tap. Sums over
tokens (phi(K)^T V, sum phi(K)) are formed in float32 and scaled by 1/N (the factor cancels), so bf16
and fp16 activations neither lose them nor overflow.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wsi.core.errors import ConfigError
from wsi.models.attention._base import ATTENTION, AttentionBase, StreamState, add_, no_autocast
from wsi.models.attention._masking import count_tokens, weighted, zero_padded
from wsi.models.attention.layout import CENTRE, OFFSETS
from wsi.models.attention.local import LocalRows, depthwise
from wsi.models.attention.seqnorm import stats_dtype


def _phi(t: Tensor) -> Tensor:
    return F.elu(t) + 1.0


@ATTENTION.register("gdla")
class GDLAttention(AttentionBase):
    no_weight_decay = frozenset({"lam", "lam_local"})

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        lambda_init: float | None = None,
        local: bool = True,
        grid_ndim: int = 2,
        eps: float = 1e-6,
        **options: object,
    ) -> None:
        super().__init__(dim, heads, **options)  # type: ignore[arg-type]
        if self.head_dim % 2:
            raise ConfigError(f"gdla splits each head in two: head width {self.head_dim} must be even")
        if grid_ndim not in OFFSETS:
            raise ConfigError(f"gdla grid_ndim must be 2 or 3, got {grid_ndim}")
        d, wide = self.inner_dim, 4 * self.inner_dim
        self.eps, self.grid_ndim, self.local = float(eps), grid_ndim, bool(local)
        self.needs_neighbours = self.local
        self.to_gate = nn.Linear(dim, d)
        self.lam = nn.Parameter(self._lambda_start(heads, lambda_init))
        self.rms_weight = nn.Parameter(torch.ones(self.head_dim))  # shared by heads and both paths
        if self.local:
            taps = len(OFFSETS[grid_ndim])
            bound = 1.0 / math.sqrt(taps)  # nn.Conv2d's default init for a depthwise kernel
            self.lam_local = nn.Parameter(self._lambda_start(heads, lambda_init))
            self.dwc_weight = nn.Parameter(torch.empty(wide, taps).uniform_(-bound, bound))  # (4D, T)
            self.dwc_bias = nn.Parameter(torch.empty(wide).uniform_(-bound, bound))
            self.pwc = nn.Linear(wide, wide)
            self.to_out = nn.Linear(2 * d, dim)  # the concatenation fuse: [Y_global; Y_local] -> D'

    def _lambda_start(self, heads: int, value: float | None) -> Tensor:
        """lambda (heads, head width): N(0, 0.1) as the released code draws lambda_scale_main/_aux
        (github.com/xmindflow/gdla @973d374, modules/attn/gdla.py; the paper gives no start), or the
        constant `value` (the legacy block: 0.5)."""
        if value is None:
            return torch.zeros(heads, self.head_dim).normal_(mean=0.0, std=0.1)
        return torch.full((heads, self.head_dim), float(value))

    # --- pieces --------------------------------------------------------------------------------------
    def _project(self, x: Tensor) -> Tensor:
        """(B, N, D') -> [Q; K; V; G] (B, N, 4D)."""
        weight = torch.cat([self.to_qkv.weight, self.to_gate.weight])  # (4D, D'): one output, no copy
        bias = None if self.to_qkv.bias is None else torch.cat([self.to_qkv.bias, self.to_gate.bias])
        return F.linear(x, weight, bias)

    def _mix_local(self, u: Tensor, index: Tensor | None, parts: tuple[int, ...] = (0, 1, 2, 3)) -> Tensor:
        """f = PWC(DWC(u)) for u (B, M, 4D) weighted by presence; only the `parts` of [Q; K; V; G] asked."""
        dw = depthwise(u, index, self.dwc_weight, CENTRE[self.grid_ndim]) + self.dwc_bias.to(u.dtype)
        d = self.inner_dim
        rows = torch.cat([torch.arange(p * d, (p + 1) * d) for p in parts]).to(u.device)
        if len(parts) == 4:
            return self.pwc(dw)
        return F.linear(dw, self.pwc.weight[rows], self.pwc.bias[rows])

    def _keys(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """phi(K) weighted by presence and V, both zero at padding: (B, h, N, d) each."""
        return self.split(weighted(_phi(k), mask)), self.split(zero_padded(v, mask))

    def _summaries(self, k: Tensor, v: Tensor, n: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per half i: (phi(K_i)^T V / N (B, h, d/2, d), sum phi(K_i) / N (B, h, d/2)), in float32."""
        acc = stats_dtype(k)
        half = self.head_dim // 2
        out = []
        with no_autocast(k.device):
            for ki in (k[..., :half], k[..., half:]):
                ki = ki.to(acc) / n.to(acc).view(-1, 1, 1, 1)  # scaled before summing: cannot overflow
                out.append((torch.einsum("bhnd,bhne->bhde", ki, v.to(acc)), ki.sum(2)))
        return out

    def _attend(
        self, q: Tensor, g: Tensor, sums: list[tuple[Tensor, Tensor]], n: Tensor, lam: Tensor
    ) -> Tensor:
        """RMSNorm(A_1 - lambda A_2) * sigmoid(G) from the summaries: q, g (B, n, D) -> (B, n, D)."""
        qh = self.split(_phi(q))  # (B, h, n, d)
        half = self.head_dim // 2
        eps = (self.eps / n).view(-1, 1, 1, 1)  # the 1/N of the summaries, applied to eps too
        a = []
        for qi, (kv, ks) in zip((qh[..., :half], qh[..., half:]), sums, strict=True):
            z = torch.einsum("bhnd,bhd->bhn", qi, ks.to(qi.dtype)).unsqueeze(-1)  # (B, h, n, 1)
            a.append(torch.einsum("bhnd,bhde->bhne", qi, kv.to(qi.dtype)) / (z + eps.to(z.dtype)))
        diff = a[0] - lam[None, :, None, :] * a[1]  # (B, h, n, d)
        out = diff * torch.rsqrt(diff.pow(2).mean(-1, keepdim=True) + self.eps) * self.rms_weight
        return self.merge(out) * torch.sigmoid(g)

    def _path(self, u: Tensor, mask: Tensor | None, lam: Tensor) -> Tensor:
        q, k, v, g = u.chunk(4, -1)
        n = count_tokens(mask, u)
        return self._attend(q, g, self._summaries(*self._keys(k, v, mask), n), n, lam)

    # --- interface -----------------------------------------------------------------------------------
    def mix(self, x: Tensor, mask: Tensor | None, neighbours: Tensor | None) -> Tensor:
        u = self._project(x)  # (B, N, 4D)
        y = self._path(u, mask, self.lam)  # global path (B, N, D)
        if not self.local:
            return y.to(x.dtype)
        mixed = self._mix_local(weighted(u, mask), neighbours)  # empty cells and padding read as 0
        return torch.cat([y, self._path(mixed, mask, self.lam_local)], -1).to(x.dtype)  # (B, N, 2D)

    def _path_terms(self, u: Tensor, mask: Tensor | None, query_index: int, lam: Tensor) -> Tensor:
        """Per-token terms (B, N, D) of one path's output at `query_index`, its normalizers and RMS fixed."""
        q, k, v, g = u.chunk(4, -1)
        qh = self.split(_phi(q))[:, :, query_index]  # (B, h, d)
        kh, vh = self._keys(k, v, mask)
        half = self.head_dim // 2
        a, terms = [], []
        for qi, ki in ((qh[..., :half], kh[..., :half]), (qh[..., half:], kh[..., half:])):
            w = torch.einsum("bhd,bhnd->bhn", qi, ki).unsqueeze(-1)  # (B, h, N, 1)
            terms.append(w * vh / (w.sum(2, keepdim=True) + self.eps))  # (B, h, N, d)
            a.append(terms[-1].sum(2, keepdim=True))  # (B, h, 1, d)
        diff = a[0] - lam[None, :, None, :] * a[1]
        inv_rms = torch.rsqrt(diff.pow(2).mean(-1, keepdim=True) + self.eps)  # the query's own factor
        term = (terms[0] - lam[None, :, None, :] * terms[1]) * inv_rms * self.rms_weight
        return self.merge(term) * torch.sigmoid(g[:, query_index]).unsqueeze(1)

    def query_terms(
        self, x: Tensor, mask: Tensor | None, query_index: int, neighbours: Tensor | None
    ) -> Tensor:
        u = self._project(x)
        terms = self._path_terms(u, mask, query_index, self.lam)
        if self.local:  # a token's local-path term is that of its own mixed key and value
            mixed = self._mix_local(weighted(u, mask), neighbours)
            terms = torch.cat([terms, self._path_terms(mixed, mask, query_index, self.lam_local)], -1)
        return terms.to(x.dtype)

    # --- chunked inference ---------------------------------------------------------------------------
    def _chunk_inputs(
        self, x: Tensor, mask: Tensor | None, local: LocalRows | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """[Q;K;V;G] of the chunk's tokens, and (rows to mix, their neighbour index) for the local path."""
        if local is None:  # no grid: every token alone in its neighbourhood
            u = self._project(x)
            return u, weighted(u, mask), None
        rows = self._project(local.rows)  # (B, M, 4D): the chunk and its neighbour rows
        return rows[:, local.own], weighted(rows, local.weight), local.index

    def stream_collect(
        self, state: StreamState, x: Tensor, mask: Tensor | None, local: LocalRows | None = None
    ) -> None:
        u, rows, index = self._chunk_inputs(x, mask, local)
        add_(state, "n", count_tokens(mask, x).view(-1))
        paths = [("g", u[..., self.inner_dim : 3 * self.inner_dim])]
        if self.local:
            paths.append(("l", self._mix_local(rows, index, parts=(1, 2))))
        for name, kv in paths:
            k_raw, v_raw = kv.chunk(2, -1)
            k, v = self._keys(k_raw, v_raw, mask)
            for i, (s_kv, s_k) in enumerate(self._summaries(k, v, torch.ones_like(state["n"]))):
                add_(state, f"{name}{i}_kv", s_kv)  # raw sums, divided by N once all chunks are in
                add_(state, f"{name}{i}_k", s_k)

    def stream_mix(
        self, state: StreamState, x: Tensor, mask: Tensor | None, local: LocalRows | None = None
    ) -> Tensor:
        u, rows, index = self._chunk_inputs(x, mask, local)
        n = state["n"]
        d = self.inner_dim

        def sums(name: str) -> list[tuple[Tensor, Tensor]]:
            scale = n.view(-1, 1, 1)
            return [
                (state[f"{name}{i}_kv"] / scale.unsqueeze(-1), state[f"{name}{i}_k"] / scale) for i in (0, 1)
            ]

        y = self._attend(u[..., :d], u[..., 3 * d :], sums("g"), n, self.lam)
        if not self.local:
            return y.to(x.dtype)
        q, g = self._mix_local(rows, index, parts=(0, 3)).chunk(2, -1)
        return torch.cat([y, self._attend(q, g, sums("l"), n, self.lam_local)], -1).to(x.dtype)

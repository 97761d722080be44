"""Gated differential linear attention (`gdla`).

Queries and keys are split per head into two subspaces and mapped by the kernel phi(x) = ELU(x) + 1.
Two normalized linear attentions share V: A_i = phi(Q_i) (phi(K_i)^T V) / z_i with
z_i = phi(Q_i) (phi(K_i)^T 1). They are combined as A_1 - lambda * A_2 (learnable lambda per channel and
head, cancelling attention noise common to both), normalized by RMSNorm per head and multiplied by a
gate sigmoid(X W_G). An optional local branch (depthwise 3x3 then pointwise convolution of V on the
token grid) restores locality for images. Everything is linear in the number of tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from models.attention._base import ATTENTION, AttentionBase, StreamState, add_
from models.attention._masking import zero_padded
from wsi.errors import ConfigError


def _phi(t: Tensor) -> Tensor:
    return F.elu(t) + 1.0


@ATTENTION.register("gdla")
class GDLAttention(AttentionBase):
    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        lambda_init: float = 0.5,
        local: bool = False,
        grid_ndim: int = 2,
        eps: float = 1e-6,
        **options: object,
    ) -> None:
        super().__init__(dim, heads, **options)  # type: ignore[arg-type]
        if self.head_dim % 2:
            raise ConfigError(f"gdla splits each head in two: head width {self.head_dim} must be even")
        if grid_ndim not in (2, 3):
            raise ConfigError(f"gdla grid_ndim must be 2 or 3, got {grid_ndim}")
        self.eps = float(eps)
        self.grid_ndim = grid_ndim
        self.lam = nn.Parameter(torch.full((heads, self.head_dim), float(lambda_init)))
        self.rms_weight = nn.Parameter(torch.ones(heads, self.head_dim))
        self.to_gate = nn.Linear(dim, self.inner_dim)
        self.local: nn.Sequential | None = None
        if local:
            conv = nn.Conv2d if grid_ndim == 2 else nn.Conv3d
            d = self.inner_dim
            self.local = nn.Sequential(conv(d, d, 3, padding=1, groups=d), conv(d, d, 1))

    # --- pieces --------------------------------------------------------------------------------------
    def _features(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, ...]:
        """phi(Q_1), phi(Q_2), phi(K_1), phi(K_2) (B, h, N, d/2) and V (B, h, N, d)."""
        q, k, v = self.qkv(x)  # (B, N, D), one fused projection
        q = self.split(_phi(q))  # (B, h, N, d)
        half = self.head_dim // 2
        return (q[..., :half], q[..., half:], *self._keys_values(k, v, mask))

    def _keys_values(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """Raw K, V (B, N, D) -> phi(K_1), phi(K_2) (B, h, N, d/2), V (B, h, N, d); padded rows 0.

        Padded keys take no part in any sum or normalizer; padded values are zeroed too, so NaN/inf
        padding cannot leak through a 0 weight.
        """
        k = self.split(zero_padded(_phi(k), mask))
        v = self.split(zero_padded(v, mask))
        half = self.head_dim // 2
        return k[..., :half], k[..., half:], v

    def _combine(self, a1: Tensor, a2: Tensor) -> tuple[Tensor, Tensor]:
        """A1 - lambda A2, then its per-head RMS factor: (B, h, N, d), (B, h, N, 1)."""
        diff = a1 - self.lam[None, :, None, :] * a2
        inv_rms = torch.rsqrt(diff.pow(2).mean(-1, keepdim=True) + self.eps)
        return diff, inv_rms

    def _local(self, v: Tensor, mask: Tensor | None, grid_shape: tuple[int, ...] | None) -> Tensor | None:
        """Local branch on the LAST prod(grid_shape) tokens; leading tokens get 0. (B, N, D) or None."""
        if self.local is None or grid_shape is None:
            return None
        g = math.prod(grid_shape)
        if len(grid_shape) != self.grid_ndim or g > v.shape[1]:
            raise ConfigError(f"grid {grid_shape} does not fit {v.shape[1]} tokens / this local branch")
        on_grid = zero_padded(v, mask)[:, -g:].transpose(1, 2)  # (B, D, g)
        y = self.local(on_grid.reshape(*on_grid.shape[:2], *grid_shape)).flatten(2).transpose(1, 2)
        return F.pad(y, (0, 0, v.shape[1] - g, 0))  # (B, N, D)

    # --- interface -----------------------------------------------------------------------------------
    def mix(self, x: Tensor, mask: Tensor | None, grid_shape: tuple[int, ...] | None) -> Tensor:
        q1, q2, k1, k2, v = self._features(x, mask)
        a = []
        for q, k in ((q1, k1), (q2, k2)):
            kv = torch.einsum("bhnd,bhne->bhde", k, v)  # (B, h, d/2, d) = phi(K_i)^T V
            z = torch.einsum("bhnd,bhd->bhn", q, k.sum(2)).unsqueeze(-1)  # (B, h, N, 1) normalizer
            a.append(torch.einsum("bhnd,bhde->bhne", q, kv) / (z + self.eps))  # (B, h, N, d)
        diff, inv_rms = self._combine(*a)
        out = self.merge(diff * inv_rms * self.rms_weight[None, :, None, :])  # (B, N, D)
        local = self._local(rearrange(v, "b h n d -> b n (h d)"), mask, grid_shape)
        if local is not None:
            out = out + local
        return out * torch.sigmoid(self.to_gate(x))

    def query_terms(
        self, x: Tensor, mask: Tensor | None, query_index: int, grid_shape: tuple[int, ...] | None
    ) -> Tensor:
        n_tok = x.shape[1]
        if self.local is not None and grid_shape is not None:
            first_on_grid = n_tok - math.prod(grid_shape)
            if query_index % n_tok >= first_on_grid:
                raise ConfigError("gdla contributions with the local branch need a query off the grid")
        q1, q2, k1, k2, v = self._features(x, mask)
        a, terms = [], []
        for q, k in ((q1[:, :, query_index], k1), (q2[:, :, query_index], k2)):  # q (B, h, d/2)
            w = torch.einsum("bhd,bhnd->bhn", q, k).unsqueeze(-1)  # (B, h, N, 1)
            z = w.sum(2, keepdim=True) + self.eps  # (B, h, 1, 1) the query's normalizer
            terms.append(w * v / z)  # (B, h, N, d)
            a.append(terms[-1].sum(2, keepdim=True))  # (B, h, 1, d)
        _, inv_rms = self._combine(*a)  # the query's own RMS factor, fixed
        term = terms[0] - self.lam[None, :, None, :] * terms[1]  # (B, h, N, d)
        term = term * inv_rms * self.rms_weight[None, :, None, :]
        gate = torch.sigmoid(self.to_gate(x[:, query_index]))  # (B, D)
        return self.merge(term) * gate.unsqueeze(1)  # (B, N, D)

    def stream_collect(self, state: StreamState, x: Tensor, mask: Tensor | None) -> None:
        k1, k2, v = self._keys_values(self.project(x, 1), self.project(x, 2), mask)  # no Q needed
        for i, k in ((1, k1), (2, k2)):
            k, vv = k.double(), v.double()
            add_(state, f"kv{i}", torch.einsum("bhnd,bhne->bhde", k, vv))  # (B, h, d/2, d)
            add_(state, f"ksum{i}", k.sum(2))  # (B, h, d/2)

    def stream_mix(self, state: StreamState, x: Tensor, mask: Tensor | None) -> Tensor:
        q = self.split(_phi(self.project(x, 0)))  # (B, h, n, d)
        half = self.head_dim // 2
        a = []
        for i, qi in ((1, q[..., :half]), (2, q[..., half:])):
            kv, ksum = state[f"kv{i}"].to(q.dtype), state[f"ksum{i}"].to(q.dtype)
            z = torch.einsum("bhnd,bhd->bhn", qi, ksum).unsqueeze(-1)
            a.append(torch.einsum("bhnd,bhde->bhne", qi, kv) / (z + self.eps))
        diff, inv_rms = self._combine(*a)
        out = self.merge(diff * inv_rms * self.rms_weight[None, :, None, :])
        return out * torch.sigmoid(self.to_gate(x))

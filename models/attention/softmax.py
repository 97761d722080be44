"""Standard softmax attention (`softmax`), the quadratic baseline.

Runs through `F.scaled_dot_product_attention` so fused (flash / memory-efficient) kernels apply on a GPU.
A float mask (presence weights) enters as log-weights added to the scores: a token of weight 2 is
attended exactly like two copies of it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from wsi.models.attention._base import ATTENTION, AttentionBase, StreamState
from wsi.models.attention._masking import zero_padded
from wsi.models.attention.local import LocalRows


def _key_mask(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """(B, N) mask -> (B, 1, 1, N) attn_mask: bool (True = may attend) or additive log-weights."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return mask[:, None, None, :]
    return mask.to(dtype).log()[:, None, None, :]  # log 0 = -inf: padding takes no part


@ATTENTION.register("softmax")
class SoftmaxAttention(AttentionBase):
    """softmax(Q K^T / sqrt(d)) V per head; padded keys are masked out."""

    linear = False

    def _qkv(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V as (B, h, N, d) with padded K and V rows zeroed.

        A masked key gets weight 0, but 0 * NaN = NaN (and NaN + -inf = NaN in a score): zeroing the
        rows keeps non-finite padding out of every real token's output.
        """
        q, k, v = self.qkv(x)  # (B, N, D) each
        return self.split(q), self.split(zero_padded(k, mask)), self.split(zero_padded(v, mask))

    def mix(self, x: Tensor, mask: Tensor | None, neighbours: Tensor | None) -> Tensor:
        q, k, v = self._qkv(x, mask)  # (B, h, N, d)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=_key_mask(mask, q.dtype))  # (B, h, N, d)
        return self.merge(out)

    def query_terms(
        self, x: Tensor, mask: Tensor | None, query_index: int, neighbours: Tensor | None
    ) -> Tensor:
        q, k, v = self._qkv(x, mask)  # (B, h, N, d)
        p = self._weights(q[:, :, query_index], k, mask).unsqueeze(-1)  # (B, h, N, 1)
        return self.merge(p * v)  # (B, N, D)

    def attention_weights(self, x: Tensor, mask: Tensor | None = None, query_index: int = 0) -> Tensor:
        """The query's softmax weights over the tokens, (B, heads, N)."""
        q, k, _ = self._qkv(x, mask)
        return self._weights(q[:, :, query_index], k, mask)

    def _weights(self, q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
        """One query per head q (B, h, d) against keys k (B, h, N, d) -> softmax weights (B, h, N)."""
        scores = torch.einsum("bhd,bhnd->bhn", q, k) * self.head_dim**-0.5
        if mask is not None and mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        elif mask is not None:
            scores = scores + mask.to(scores.dtype).log()[:, None, :]
        return scores.softmax(dim=-1)

    # --- chunked inference: collect K and V, then attend one chunk of queries at a time ---------------
    def stream_collect(
        self, state: StreamState, x: Tensor, mask: Tensor | None, local: LocalRows | None = None
    ) -> None:
        k = self.split(zero_padded(self.project(x, 1), mask))  # (B, h, n, d), padded rows 0
        v = self.split(zero_padded(self.project(x, 2), mask))
        m = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
        state.chunks.setdefault("k", []).append(k)
        state.chunks.setdefault("v", []).append(v)
        state.chunks.setdefault("mask", []).append(m)

    def stream_mix(
        self, state: StreamState, x: Tensor, mask: Tensor | None, local: LocalRows | None = None
    ) -> Tensor:
        if "k_all" not in state:
            state["k_all"] = torch.cat(state.chunks.pop("k"), dim=2)  # (B, h, N, d)
            state["v_all"] = torch.cat(state.chunks.pop("v"), dim=2)
            state["mask_all"] = torch.cat(state.chunks.pop("mask"), dim=1)  # (B, N)
        q = self.split(self.project(x, 0))  # (B, h, n, d)
        out = F.scaled_dot_product_attention(
            q, state["k_all"], state["v_all"], attn_mask=_key_mask(state["mask_all"], q.dtype)
        )
        return self.merge(out)

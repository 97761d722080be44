"""Nystrom attention as TransMIL uses it: lucidrains/nystrom-attention 0.0.9 and 0.0.14, our own code.

Read from lucidrains/nystrom-attention nystrom_attention/nystrom_attention.py at tag 0.0.14
(fbe9ebad6bae) and tag 0.0.9 (e3c4aa5c988f), the `NystromAttention` TransMIL imports
(szc19990412/TransMIL requirements.txt @ 9d6aee57c7c7 pins nystrom-attention==0.0.9; KatherLab/STAMP
src/stamp/modeling/models/trans_mil.py @ c54ce0673962 vendors 0.0.14's computation). What it computes,
including the details that change the numbers:

- the sequence (n tokens) is zero-padded at the FRONT to a multiple of m landmarks; the padding rows stay
  in every sum below (no mask: TransMIL passes none); 0.0.14 returns the last n rows (`out[:, -n:]`, the
  tokens' own), 0.0.9 the FIRST n (`out[:, :n]`, changed in d7eb229 "fix padding bug", 0.0.10): with p
  padding rows, token i then receives padded row i's output, a padding row's for i < p and token i - p's
  otherwise (`rows`: "last" | "first");
- q, k, v = x W (no bias), q scaled by d^-1/2; landmarks are the means of m contiguous segments of
  l = ceil(n/m) rows of q and of k;
- out = (softmax(q k_l^T) pinv(softmax(q_l k_l^T))) (softmax(q_l k^T) v) + conv_33(v), the last a
  depthwise convolution of each head's values along the sequence;
- pinv is 6 Newton-Schulz iterations started from x^T / (max row sum * max column sum), the maxima
  taken over the whole tensor: over every head (and, in the authors' code, every bag of a batch; ours
  takes them per bag, which is the same for TransMIL's one bag at a time).

Short bags: a bag of n tokens pads to m rows when n < m, so most landmarks are made of padding
only; `core` runs the pinv on the landmark matrix with those as one index (the same polynomial, the
same output and gradients to float32 rounding; tests/models/baselines/test_mil_baselines.py), which made a CPU
training step on a 36-tile bag about 10x faster (docs/benchmarks.md).

The core runs in float32 with autocast off (bf16 would break the pinv iterations). `forward_lean`
computes the same output for one bag without gradients in O(n dim) memory: one head and one chunk of
queries at a time, never the (heads, n, m) similarity matrices (TransMIL's inference on long bags).

Dropout (training only) follows `to_out` as in the authors' `nn.Sequential(nn.Linear, nn.Dropout)`,
which runs on the whole padded sequence before the rows are selected: the mask is drawn over the padded
length here too, so one seed draws the authors' mask (tests/models/test_mil_baselines_training.py).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def iterative_pinv(x: Tensor, iters: int, first_weight: float = 1.0) -> Tensor:
    """Newton-Schulz approximation of pinv(x) for (B, H, m, m); scaled by maxima over heads and rows.

    `first_weight` w > 1: x is the reduced form of a larger matrix whose index 0 stands for w indices
    with identical rows and identical columns (the all-padding landmarks, `NystromAttention.core`):
    x[..., i, 0] is one of the w equal entries of row i and x[..., 0, j] the common row. The result
    is then pinv's reduced form (the same polynomial in the larger matrix, computed on the small one)."""
    weights = torch.ones(x.shape[-1], device=x.device, dtype=x.dtype)
    weights[0] = first_weight
    absx = x.abs()
    col = (absx * weights).sum(-1).amax(dim=(-2, -1), keepdim=True)  # (B, 1, 1): largest row sum of any head
    row = (absx * weights[:, None]).sum(-2).amax(dim=(-2, -1), keepdim=True)
    z = x.transpose(-1, -2) * weights / (col * row).unsqueeze(-1)
    x = x * weights
    eye = torch.eye(x.shape[-1], device=x.device, dtype=x.dtype)
    for _ in range(iters):
        xz = x @ z
        z = 0.25 * z @ (13 * eye - (xz @ (15 * eye - (xz @ (7 * eye - xz)))))
    return z


class NystromAttention(nn.Module):
    """Parameters as the authors' (`to_qkv`, `to_out`, `res_conv`); forward(x (B, n, dim)) -> (B, n, dim)."""

    def __init__(
        self,
        dim: int,
        *,
        heads: int,
        dim_head: int,
        landmarks: int,
        pinv_iterations: int = 6,
        conv_kernel: int = 33,
        dropout: float = 0.0,
        rows: Literal["last", "first"] = "last",
    ) -> None:
        super().__init__()
        self.rows = rows  # which n rows of the padded output are the tokens': 0.0.14 last, 0.0.9 first
        inner = heads * dim_head
        self.heads, self.dim_head, self.landmarks, self.iters = heads, dim_head, landmarks, pinv_iterations
        self.scale = dim_head**-0.5
        self.to_qkv = nn.Linear(dim, 3 * inner, bias=False)
        self.to_out = nn.Linear(inner, dim)
        self.drop = nn.Dropout(dropout)
        pad = conv_kernel // 2
        self.res_conv = nn.Conv2d(heads, heads, (conv_kernel, 1), padding=(pad, 0), groups=heads, bias=False)

    # --- one pass, batched (training and short bags) ------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        q, k, v = (
            t.unflatten(-1, (self.heads, self.dim_head)).transpose(1, 2) for t in self.to_qkv(x).chunk(3, -1)
        )
        out = self.core(q, k, v)  # (B, H, n, d) float32
        out = out.transpose(1, 2).flatten(2).to(x.dtype)  # (B, n, H d)
        return self._dropout(self.to_out(out))

    def _offset(self, n: int) -> int:
        """Where the n output rows start in the front-padded sequence: after the padding (0.0.14's
        `out[:, -n:]`) or at its start (0.0.9's `out[:, :n]`)."""
        return (-n) % self.landmarks if self.rows == "last" else 0

    def _dropout(self, out: Tensor) -> Tensor:
        """Dropout with its mask drawn over the padded sequence, as the authors' to_out draws it."""
        if not (self.training and self.drop.p > 0):
            return out
        n = out.shape[1]
        pad, start = (-n) % self.landmarks, self._offset(n)
        full = F.pad(out, (0, 0, start, pad - start))
        return self.drop(full)[:, start : start + n]

    def core(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The bag's rows (B, H, n, d) each -> the heads' outputs at those rows (B, H, n, d), float32.

        The padding rows of q, k, v are exact zeros (no bias in to_qkv), so the first p_l = pad // seg
        landmarks are all zero: the landmark matrix has p_l identical rows and p_l identical columns,
        and so has every product the pinv iterations form from it. They run on its reduced form (one
        index for the p_l, `iterative_pinv(first_weight=p_l)`), the same polynomial on an (m - p_l + 1)
        square matrix instead of (m, m): on a bag of 30 tiles 51 instead of 256 rows. The padding
        rows' outputs, which the authors' code computes and then drops, are not computed."""
        with torch.autocast(q.device.type, enabled=False):
            q, k, v = q.float() * self.scale, k.float(), v.float()
            b, h, n, d = q.shape
            m = self.landmarks
            pad = (-n) % m
            seg = (n + pad) // m
            k, v = F.pad(k, (0, 0, pad, 0)), F.pad(v, (0, 0, pad, 0))
            ql = F.pad(q, (0, 0, pad, 0)).reshape(b, h, m, seg, d).sum(3) / seg
            kl = k.reshape(b, h, m, seg, d).sum(3) / seg
            zeros = pad // seg  # landmarks made of padding only
            first, weight = max(zeros - 1, 0), max(zeros, 1)
            ql = ql[:, :, first:]  # the reduced landmarks: one zero landmark standing for all of them
            attn2 = torch.softmax(ql @ kl.transpose(-1, -2), -1)[..., first:]  # rows of softmax over all m
            attn2_inv = iterative_pinv(attn2, self.iters, float(weight))
            values = torch.softmax(ql @ k.transpose(-1, -2), -1) @ v  # (B, H, m - first, d)
            start = self._offset(n)  # the output rows of the padded sequence: pad (0.0.14) or 0 (0.0.9)
            q_rows = q if start == pad else F.pad(q, (0, 0, pad, 0))[:, :, start : start + n]
            attn1 = torch.softmax(q_rows @ kl.transpose(-1, -2), -1)[..., first:]
            attn1 = torch.cat([attn1[..., :1] * weight, attn1[..., 1:]], -1)
            out = (attn1 @ attn2_inv) @ values
            conv = self.res_conv.weight.float()
            res = F.conv2d(v, conv, padding=self.res_conv.padding, groups=self.heads)
            return out + res[:, :, start : start + n]

    # --- one bag, no gradients, O(n dim) memory ------------------------------------------------------
    def _head_qkv(self, x: Tensor, head: int, pad: int) -> tuple[Tensor, Tensor, Tensor]:
        """Head `head`'s q (scaled), k, v (N, d) in float32 for one bag's rows x (n, dim), front-padded."""
        inner, d = self.heads * self.dim_head, self.dim_head
        w = self.to_qkv.weight
        out = []
        for part in range(3):
            rows = w[part * inner + head * d : part * inner + (head + 1) * d]  # (d, dim)
            t = torch.zeros(x.shape[0] + pad, d, device=x.device, dtype=torch.float32)
            t[pad:] = (x @ rows.T.to(x.dtype)).float()
            out.append(t)
        return out[0] * self.scale, out[1], out[2]

    @torch.no_grad()
    def forward_lean(self, x: Tensor, chunk: int = 4096) -> Tensor:
        """One bag x (1, n, dim) -> (1, n, dim) as `forward` in eval mode, one head and `chunk` queries at a
        time: memory for x, the output and one head's (N, d) q, k, v."""
        n, m = x.shape[1], self.landmarks
        pad = (-n) % m
        big_n = n + pad
        seg = big_n // m
        start = self._offset(n)
        rows = x[0]
        with torch.autocast(x.device.type, enabled=False):
            ql = torch.empty(self.heads, m, self.dim_head, device=x.device)
            kl = torch.empty_like(ql)
            for h in range(self.heads):
                q, k, _ = self._head_qkv(rows, h, pad)
                ql[h] = q.reshape(m, seg, -1).sum(1) / seg
                kl[h] = k.reshape(m, seg, -1).sum(1) / seg
            attn2_inv = iterative_pinv(torch.softmax(ql @ kl.transpose(-1, -2), -1)[None], self.iters)[0]
            out = torch.zeros(n, self.to_out.out_features, device=x.device)
            w_out = self.to_out.weight.float()
            for h in range(self.heads):
                q, k, v = self._head_qkv(rows, h, pad)
                values = torch.softmax(ql[h] @ k.T, -1) @ v  # (m, d)
                conv = self.res_conv.weight[h : h + 1].float()  # (1, 1, K, 1)
                res = F.conv2d(v[None, None], conv, padding=self.res_conv.padding)[0, 0]  # (N, d)
                w_h = w_out[:, h * self.dim_head : (h + 1) * self.dim_head]  # (dim, d)
                for first in range(start, start + n, chunk):
                    sl = slice(first, min(first + chunk, start + n))
                    att = (torch.softmax(q[sl] @ kl[h].T, -1) @ attn2_inv[h]) @ values
                    out[sl.start - start : sl.stop - start] += (att + res[sl]) @ w_h.T
            out += self.to_out.bias.float()
        return out[None].to(x.dtype)

    @torch.no_grad()
    def query_attention(self, x: Tensor, query: int) -> Tensor:
        """The Nystrom attention row of token `query` over the bag (B, H, n): softmax(q k_l^T) pinv
        softmax(q_l k^T), as the authors' `return_attn` gives it (the padded row whose output token
        `query` receives: `rows`), without the value convolution."""
        b, n, _ = x.shape
        pad = (-n) % self.landmarks
        q, k, _ = (
            t.unflatten(-1, (self.heads, self.dim_head)).transpose(1, 2)
            for t in self.to_qkv(F.pad(x, (0, 0, pad, 0))).chunk(3, -1)
        )
        with torch.autocast(q.device.type, enabled=False):
            q, k = q.float() * self.scale, k.float()
            m, seg = self.landmarks, (n + pad) // self.landmarks
            ql = q.reshape(b, self.heads, m, seg, -1).sum(3) / seg
            kl = k.reshape(b, self.heads, m, seg, -1).sum(3) / seg
            attn2_inv = iterative_pinv(torch.softmax(ql @ kl.transpose(-1, -2), -1), self.iters)
            at = self._offset(n) + query  # the padded row whose output is token `query`'s
            row = torch.softmax(q[:, :, at : at + 1] @ kl.transpose(-1, -2), -1)
            attn = (row @ attn2_inv) @ torch.softmax(ql @ k.transpose(-1, -2), -1)  # (B, H, 1, N)
        return attn[:, :, 0, pad:]


__all__ = ["NystromAttention", "iterative_pinv"]

"""LongNet's dilated-attention transformer encoder, in plain torch, as Prov-GigaPath's slide encoder runs it.

Written from prov-gigapath/prov-gigapath 09d8e87 gigapath/torchscale: model/LongNet.py, architecture/
encoder.py and config.py (pre-norm, `subln` on: an inner LayerNorm before out_proj and one inside the
FFN; a final `layer_norm`; GELU; eps 1e-5), component/dilated_attention.py and feedforward_network.py.
Module and tensor names follow theirs, so their checkpoint loads key for key.

Memory: no (L, L) matrix exists. Each sparse segment goes through PyTorch's fused flash-attention kernel
on the CPU (elsewhere `ATTN_BLOCK` scores at a time), the branches merge online, and row-wise layers run
`ROW_CHUNK` tokens at a time: a layer holds q, k, v and the output, linear in the number of tiles.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

#: scores computed at once per attention block (float32: 64 MiB, with the same again for their exp)
ATTN_BLOCK = 1 << 24
#: tokens per pass through the row-wise layers (LayerNorm, projections, FFN)
ROW_CHUNK = 8192


def optimal_segment_lengths(max_wsi_size: int = 262144, tile_size: int = 256) -> tuple[int, ...]:
    """gigapath/slide_encoder.py `get_optimal_segment_length`: five lengths, log2-spaced from 1024 to the
    longest sequence (max_wsi_size / tile_size)^2; (1024, 5792, 32768, 185363, 1048576) for the defaults."""
    max_seq_len = (max_wsi_size // tile_size) ** 2
    exponents = np.linspace(np.log2(1024), int(np.log2(max_seq_len)), 5)
    return tuple(int(v) for v in np.power(2, exponents).astype(int))


@dataclass(frozen=True)
class LongNetConfig:
    """One LongNet encoder (defaults: `LongNet_12_layers_768_dim` with GigaPath's segment lengths)."""

    dim: int = 768
    depth: int = 12
    heads: int = 16
    ffn_dim: int = 3072
    segment_lengths: tuple[int, ...] = optimal_segment_lengths()
    dilated_ratios: tuple[int, ...] = (1, 2, 4, 8, 16)
    eps: float = 1e-5

    def __post_init__(self) -> None:
        if len(self.segment_lengths) != len(self.dilated_ratios):
            raise ValueError("LongNet needs one dilated ratio per segment length")
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not a multiple of {self.heads} heads")


# ------------------------------------------------------------------------------------------ attention
#: PyTorch's fused CPU flash-attention kernel (what F.scaled_dot_product_attention runs on the CPU), called
#: directly because it also returns the log-sum-exp the branches are merged with; 3-4x the explicit math
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
#: below this many keys the kernel's fixed cost (~ms per call) exceeds the explicit math's
_FUSED_MIN_KEYS = 128


def _attend_explicit(
    qt: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, n, d) each -> output (h, n, d), log-sum-exp (h, n); `ATTN_BLOCK` scores at a time."""
    heads, n, _ = qt.shape
    out = torch.empty_like(qt)
    lse = torch.empty(heads, n, dtype=qt.dtype, device=qt.device)
    rows = max(1, ATTN_BLOCK // max(1, heads * kt.shape[1]))
    for s in range(0, n, rows):
        scores = torch.matmul(qt[:, s : s + rows], kt.transpose(1, 2)).mul_(scale)  # (h, c, n)
        top = scores.amax(-1, keepdim=True)
        p = scores.sub_(top).exp_()
        total = p.sum(-1, keepdim=True)
        out[:, s : s + rows] = torch.matmul(p, vt).div_(total)
        lse[:, s : s + rows] = (top + total.log())[..., 0]
    return out, lse


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, n_zero_keys: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of q (n, h, d) over k, v (n, h, d) plus `n_zero_keys` keys and values of zeros.

    Returns the output (n, h, d) and the log-sum-exp of the scaled scores (n, h), as flash-attn does."""
    qt, kt, vt = (t.transpose(0, 1).contiguous() for t in (q, k, v))  # (h, n, d), strided views copied
    if _CPU_FLASH is not None and qt.device.type == "cpu" and qt.shape[1] >= _FUSED_MIN_KEYS:
        out, lse = (t[0] for t in _CPU_FLASH(qt[None], kt[None], vt[None], scale=scale))
    else:  # CUDA and others: chunked matmuls (no fused kernel returns the log-sum-exp publicly)
        out, lse = _attend_explicit(qt, kt, vt, scale)
    if n_zero_keys:  # each zero key scores 0: exp(0) more in the denominator, nothing in the numerator
        total = torch.logaddexp(lse, torch.full_like(lse, math.log(n_zero_keys)))
        out = out * torch.exp(lse - total)[..., None]
        lse = total
    return out.transpose(0, 1), lse.transpose(0, 1)


def dilated_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segment_lengths: Sequence[int],
    dilated_ratios: Sequence[int],
) -> torch.Tensor:
    """Dilated attention of one sequence: q, k, v (L, H, d) -> (L, H, d), equal to the authors' forward.

    Per (segment length w, dilation r): the sequence, zero-padded to a multiple of min(w, L), is cut into
    segments; in each, head group j attends among positions j, j+r, j+2r, ... only. The branches merge
    per position and head, weighted by the softmax of their log-sum-exp (`scattering`), on the fly. The
    authors' flash-attn gets no mask, so the zero-padded keys join every softmax with score 0 and value
    0: part of the published model, kept analytically (n zero keys add n * exp(0) to the denominator)."""
    length, heads, head_dim = q.shape
    scale = head_dim**-0.5
    acc = torch.zeros_like(q)  # sum over branches of exp(lse - run_max) * branch output
    run_sum = torch.zeros(length, heads, dtype=q.dtype, device=q.device)
    run_max = torch.full((length, heads), -math.inf, dtype=q.dtype, device=q.device)
    for seg_len, ratio in zip(segment_lengths, dilated_ratios, strict=True):
        seg = min(seg_len, length)
        group = -(-heads // ratio)  # heads per offset (the authors pad heads to a multiple of r)
        sparse_len = -(-seg // ratio)  # keys per head in one sparse segment, padding included
        for start in range(0, length, seg):
            real = min(seg, length - start)  # the last segment is zero-padded to `seg`
            for j in range(min(ratio, real)):
                h0, h1 = j * group, min((j + 1) * group, heads)
                if h0 >= heads:
                    break
                sel = slice(start + j, start + real, ratio)
                out, lse = _attend(q[sel, h0:h1], k[sel, h0:h1], v[sel, h0:h1], scale,
                                   sparse_len - len(range(j, real, ratio)))  # fmt: skip
                m_old = run_max[sel, h0:h1]  # views: the updates land in acc, run_sum, run_max
                m_new = torch.maximum(m_old, lse)
                keep, add = torch.exp(m_old - m_new), torch.exp(lse - m_new)
                acc[sel, h0:h1].mul_(keep[..., None]).add_(out * add[..., None])
                run_sum[sel, h0:h1].mul_(keep).add_(add)
                m_old.copy_(m_new)
    return acc.div_(run_sum[..., None])


# ------------------------------------------------------------------------------------------- modules
def _by_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, out: torch.Tensor) -> None:
    """out[i] = fn(x[i]) for a row-wise fn, `ROW_CHUNK` rows at a time (out may be x itself)."""
    for s in range(0, x.shape[0], ROW_CHUNK):
        out[s : s + ROW_CHUNK] = fn(x[s : s + ROW_CHUNK])


class DilatedAttention(nn.Module):
    """torchscale MultiheadAttention's parameters (q/k/v/out_proj, subln inner_attn_ln), dilated forward."""

    def __init__(self, cfg: LongNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.k_proj = nn.Linear(cfg.dim, cfg.dim)
        self.v_proj = nn.Linear(cfg.dim, cfg.dim)
        self.q_proj = nn.Linear(cfg.dim, cfg.dim)
        self.out_proj = nn.Linear(cfg.dim, cfg.dim)
        self.inner_attn_ln = nn.LayerNorm(cfg.dim, eps=cfg.eps)


class FeedForward(nn.Module):
    """torchscale FeedForwardNetwork with subln: fc1, GELU, ffn_layernorm, fc2."""

    def __init__(self, cfg: LongNetConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.dim, cfg.ffn_dim)
        self.fc2 = nn.Linear(cfg.ffn_dim, cfg.dim)
        self.ffn_layernorm = nn.LayerNorm(cfg.ffn_dim, eps=cfg.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ffn_layernorm(F.gelu(self.fc1(x))))


class EncoderLayer(nn.Module):
    """Pre-norm block: x + attn(LN(x)), then x + ffn(LN(x)) (no drop-path or dropout at inference)."""

    def __init__(self, cfg: LongNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.self_attn = DilatedAttention(cfg)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.ffn = FeedForward(cfg)
        self.final_layer_norm = nn.LayerNorm(cfg.dim, eps=cfg.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (L, dim) float32, updated in place and returned."""
        cfg, attn = self.cfg, self.self_attn
        length = x.shape[0]
        q, k, v = (torch.empty_like(x) for _ in range(3))
        for s in range(0, length, ROW_CHUNK):
            h = self.self_attn_layer_norm(x[s : s + ROW_CHUNK])
            q[s : s + ROW_CHUNK], k[s : s + ROW_CHUNK] = attn.q_proj(h), attn.k_proj(h)
            v[s : s + ROW_CHUNK] = attn.v_proj(h)
        shape = (length, cfg.heads, cfg.dim // cfg.heads)
        mixed = dilated_attention(q.view(shape), k.view(shape), v.view(shape), cfg.segment_lengths,
                                  cfg.dilated_ratios).view(length, cfg.dim)  # fmt: skip
        del q, k, v
        for s in range(0, length, ROW_CHUNK):
            x[s : s + ROW_CHUNK] += attn.out_proj(attn.inner_attn_ln(mixed[s : s + ROW_CHUNK]))
        del mixed
        for s in range(0, length, ROW_CHUNK):
            rows = x[s : s + ROW_CHUNK]
            rows += self.ffn(self.final_layer_norm(rows))
        return x


class LongNetEncoder(nn.Module):
    """torchscale Encoder: `layers`, then `layer_norm` (normalize_before and normalize_output)."""

    def __init__(self, cfg: LongNetConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.depth))
        self.layer_norm = nn.LayerNorm(cfg.dim, eps=cfg.eps)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """`encoder_out`: the last hidden states through `layer_norm`, in place."""
        _by_rows(self.layer_norm, x, x)
        return x


__all__ = [
    "ATTN_BLOCK",
    "ROW_CHUNK",
    "DilatedAttention",
    "EncoderLayer",
    "LongNetConfig",
    "LongNetEncoder",
    "dilated_attention",
    "optimal_segment_lengths",
]

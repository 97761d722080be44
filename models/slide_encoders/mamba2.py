"""The Mamba-2 mixer in plain torch (CPU or GPU, no mamba_ssm / Triton), streamed over a long sequence.

Parameters (names, shapes, defaults) as mamba_ssm.modules.mamba2.Mamba2 (state-spaces/mamba e9594ce);
its math as that file's `step` and `rms_norm_ref` (ops/triton/layernorm_gated.py) write it:
  z, xBC, dt = split(in_proj(u));  xBC = silu(causal depthwise conv1d(xBC));  x, B, C = split(xBC)
  dt = softplus(dt + dt_bias);  A = -exp(A_log)
  h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T   (per head: (headdim, d_state));  y_t = h_t C_t + D x_t
  y = rmsnorm(y * silu(z)) * weight (eps 1e-5, one group);  out = out_proj(y)
The scan runs in blocks of `BLOCK` steps in the state-space-dual form (Dao & Gu 2024), y = (C B^T o L)
(dt x) with L[t, s] = exp(sum_{s<r<=t} dt_r A) plus the carried state; conv and SSM states carry
across calls, so a 100,000-tile sequence runs chunk by chunk in bounded memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: steps per state-space-dual block: the block's (BLOCK, BLOCK, heads) decay matrix is its memory
BLOCK = 256

State = tuple[torch.Tensor, torch.Tensor]  # conv tail (d_conv - 1, conv_dim), ssm (heads, headdim, d_state)


class _GatedRMSNorm(nn.Module):
    """mamba_ssm RMSNorm(d, eps=1e-5, norm_before_gate=False, group_size=d): rmsnorm(x * silu(z))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        x = x * F.silu(z.to(x.dtype))
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * self.weight.to(x.dtype)


class Mamba2Mixer(nn.Module):
    """Mamba2(d_model, d_state, d_conv=4, expand=2) with mamba_ssm's tensor names."""

    def __init__(self, d_model: int, d_state: int = 128, d_conv: int = 4, expand: int = 2, headdim: int = 64):
        super().__init__()
        self.d_inner, self.d_state, self.d_conv, self.headdim = expand * d_model, d_state, d_conv, headdim
        self.nheads = self.d_inner // headdim
        conv_dim = self.d_inner + 2 * d_state
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * d_state + self.nheads, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv - 1, bias=True)
        self.dt_bias = nn.Parameter(torch.zeros(self.nheads))
        self.A_log = nn.Parameter(torch.zeros(self.nheads))
        self.D = nn.Parameter(torch.ones(self.nheads))
        self.norm = _GatedRMSNorm(self.d_inner)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def initial_state(self, device: torch.device) -> State:
        conv_dim = self.d_inner + 2 * self.d_state
        return (
            torch.zeros(self.d_conv - 1, conv_dim, device=device),
            torch.zeros(self.nheads, self.headdim, self.d_state, device=device),
        )

    def forward(self, u: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """u (L, d_model), the next L steps of the sequence -> (out (L, d_model), state after them)."""
        conv_tail, h = state
        zxbcdt = self.in_proj(u)
        z, xbc, dt = torch.split(zxbcdt, [self.d_inner, self.d_inner + 2 * self.d_state, self.nheads], -1)
        ext = torch.cat([conv_tail.to(xbc.dtype), xbc])  # the previous d_conv - 1 steps, then these
        conv = F.conv1d(ext.T[None], self.conv1d.weight, self.conv1d.bias, groups=ext.shape[1])[0].T
        x, b, c = torch.split(F.silu(conv), [self.d_inner, self.d_state, self.d_state], -1)
        f = torch.promote_types(u.dtype, torch.float32)  # the scan in float32 at least (float16 bags)
        dt = F.softplus(dt.to(f) + self.dt_bias.to(f))  # (L, H)
        a = dt * -torch.exp(self.A_log.to(f))  # (L, H): log of the per-step decay
        xh = x.to(f).unflatten(-1, (self.nheads, self.headdim))  # (L, H, P)
        ys = []
        for s in range(0, u.shape[0], BLOCK):
            y_blk, h = _ssd_block(xh[s : s + BLOCK], dt[s : s + BLOCK], a[s : s + BLOCK],
                                  b[s : s + BLOCK].to(f), c[s : s + BLOCK].to(f), h.to(f))  # fmt: skip
            ys.append(y_blk)
        y = torch.cat(ys) + xh * self.D.to(f)[:, None]
        y = self.norm(y.flatten(1), z)
        return self.out_proj(y.to(u.dtype)), (ext[-(self.d_conv - 1) :].detach(), h)


def _ssd_block(
    x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, h0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block of the scan. x (T, H, P), dt/a (T, H), b/c (T, N), h0 (H, P, N) -> y (T, H, P), h_T."""
    cum = torch.cumsum(a, 0)  # (T, H): log decay from the block start to t, inclusive
    t = x.shape[0]
    cum_h = cum.T.contiguous()  # (H, T): every (H, T, S) tensor below is contiguous, for a fast bmm
    seg = cum_h[:, :, None] - cum_h[:, None, :]  # (H, T, S): log decay from step s to step t
    seg = seg.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=x.device).tril(), float("-inf"))
    weights = torch.exp(seg).mul_((c @ b.T)[None]).mul_(dt.T[:, None, :])  # (H, T, S)
    y = torch.bmm(weights, x.transpose(0, 1).contiguous()).transpose(0, 1)  # (T, H, P)
    n_h, n_p = x.shape[1], x.shape[2]
    y = y + torch.exp(cum)[:, :, None] * (c @ h0.reshape(n_h * n_p, -1).T).view(t, n_h, n_p)  # carried in
    to_end = torch.exp(cum[-1][None, :] - cum) * dt  # (S, H): decay from step s to the block end
    h = torch.exp(cum[-1])[:, None, None] * h0 + ((to_end[:, :, None] * x).reshape(t, -1).T @ b).view_as(h0)
    return y, h

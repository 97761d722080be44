"""An independent float64 reference of gdla written from the paper's equations, the quadratic way.

Global path: per head, phi = ELU + 1 on Q and K, two halves i = 1, 2 with kernel matrices
S_i = phi(Q_i) phi(K_i)^T (N x N), A_i = S_i V / (S_i 1 + eps); Y = RMSNorm(A_1 - lambda A_2) * w_rms,
times sigmoid(G). Local path: U = [Q; K; V; G] (N, 4D); DWC(U)_n = b + sum over the 3x3 cells c around
token n of w_c * U_(token in c) (an empty cell adds nothing); PWC is a 4D x 4D linear map; the mixed
tensors go through a second gated differential linear attention with lambda'. Output:
W_O [Y_global, Y_local] + b_O. Neighbours come from an explicit cell -> token dict, not models.layout.
"""

from __future__ import annotations

import torch


def _phi(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t > 0, t + 1, torch.exp(t))  # ELU + 1


def _dla(attn, q, k, v, g, lam: torch.Tensor) -> torch.Tensor:
    """(N, D) each -> (N, D): the gated differential linear attention of every head."""
    d = attn.head_dim
    outs = []
    for h in range(attn.heads):
        cols = slice(h * d, (h + 1) * d)
        qh, kh, vh = _phi(q[:, cols]), _phi(k[:, cols]), v[:, cols]
        a = []
        for part in (slice(0, d // 2), slice(d // 2, d)):
            s = qh[:, part] @ kh[:, part].T  # (N, N) kernel scores
            a.append((s @ vh) / (s.sum(1, keepdim=True) + attn.eps))
        diff = a[0] - lam[h] * a[1]
        outs.append(diff / torch.sqrt(diff.pow(2).mean(-1, keepdim=True) + attn.eps) * attn.rms_weight)
    return torch.cat(outs, -1) * torch.sigmoid(g)


def ref_gdla(attn, x: torch.Tensor, cells: dict[int, tuple[int, int]] | None = None) -> torch.Tensor:
    """x (N, D') float64 -> (N, D'). `cells` maps a token index to its (row, column) grid cell; tokens
    not in it (a class token) are alone in their neighbourhood."""
    inner = attn.inner_dim
    w, b = attn.to_qkv.weight, attn.to_qkv.bias
    b = torch.zeros(3 * inner, dtype=x.dtype) if b is None else b
    q, k, v = (x @ w[i * inner : (i + 1) * inner].T + b[i * inner : (i + 1) * inner] for i in range(3))
    g = x @ attn.to_gate.weight.T + attn.to_gate.bias
    y = _dla(attn, q, k, v, g, attn.lam)
    if attn.local:
        u = torch.cat([q, k, v, g], -1)  # (N, 4D)
        where = {cell: i for i, cell in (cells or {}).items()}
        dw = attn.dwc_bias.expand(x.shape[0], -1).clone()
        for i in range(x.shape[0]):
            r, c = (cells or {}).get(i, (None, None))
            for tap, (dr, dc) in enumerate((dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1)):
                j = i if (dr, dc) == (0, 0) else (None if r is None else where.get((r + dr, c + dc)))
                if j is not None:
                    dw[i] = dw[i] + attn.dwc_weight[:, tap] * u[j]
        mixed = dw @ attn.pwc.weight.T + attn.pwc.bias
        y = torch.cat([y, _dla(attn, *mixed.split(inner, -1), attn.lam_local)], -1)
    return y @ attn.to_out.weight.T + attn.to_out.bias

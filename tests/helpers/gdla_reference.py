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


def ref_dwc(
    weight: torch.Tensor, bias: torch.Tensor, u: torch.Tensor, cells: dict[int, tuple[int, int]] | None
) -> torch.Tensor:
    """Depthwise 3x3 with bias, u (N, C) -> (N, C): out_n = b + sum over the 3x3 cells c around token
    n (row-major taps) of w_c * u_(token in c); an empty cell adds nothing, a token without a cell sees
    only itself."""
    where = {cell: i for i, cell in (cells or {}).items()}
    out = bias.expand(u.shape[0], -1).clone()
    for i in range(u.shape[0]):
        r, c = (cells or {}).get(i, (None, None))
        for tap, (dr, dc) in enumerate((dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1)):
            j = i if (dr, dc) == (0, 0) else (None if r is None else where.get((r + dr, c + dc)))
            if j is not None:
                out[i] = out[i] + weight[:, tap] * u[j]
    return out


def ref_block(block, x: torch.Tensor, cells: dict[int, tuple[int, int]] | None = None) -> torch.Tensor:
    """GDLA's block, x (N, D') float64 -> (N, D'), from the paper (002_c0df02e6ea3bd407.txt):
    x1 = x + GDLA(SiLU(DWC3x3(LN1(x)))) (Figure 2: the positional embedding replaced by a 3x3
    depth-wise convolution; SiLU as the authors' released block applies it), then
    eq. 29: [X^; G] = DWC3x3(SiLU(Conv1x1(LN2(x1)))), eq. 30: Y = Conv1x1(X^ * SiLU(G)); out = x1 + Y."""

    def ln(norm, t: torch.Tensor) -> torch.Tensor:
        mu, var = t.mean(-1, keepdim=True), t.var(-1, unbiased=False, keepdim=True)
        return (t - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias

    def silu(t: torch.Tensor) -> torch.Tensor:
        return t / (1 + torch.exp(-t))

    a = silu(ref_dwc(block.pre.dwc.weight, block.pre.dwc.bias, ln(block.norm1, x), cells))
    x1 = x + ref_gdla(block.attn, a, cells)
    ffn = block.mlp
    hidden = silu(ln(block.norm2, x1) @ ffn.pwc1.weight.T + ffn.pwc1.bias)  # (N, 2 d_hidden)
    mixed = ref_dwc(ffn.dwc.weight, ffn.dwc.bias, hidden, cells)
    x_hat, gate = mixed.chunk(2, -1)
    return x1 + (x_hat * silu(gate)) @ ffn.pwc2.weight.T


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
        dw = ref_dwc(attn.dwc_weight, attn.dwc_bias, u, cells)
        mixed = dw @ attn.pwc.weight.T + attn.pwc.bias
        y = torch.cat([y, _dla(attn, *mixed.split(inner, -1), attn.lam_local)], -1)
    return y @ attn.to_out.weight.T + attn.to_out.bias

"""How far `tile_effects` is from exact leave-one-out, per model kind and method, on peaked models.

Each model is built at a small width, then made to concentrate on few tiles as a trained small-cohort
model does: the pooling's score vector (pool: gated, ABMIL) and every block's query projection are
multiplied by `--sharpen` (softmax and gdla attention sharpen; seqnorm and sima normalise Q away). The exact
leave-one-out (one forward per tile with it masked out) is the reference; the table prints the
relative error ||effects - loo|| / ||loo|| of every method the kind supports and the largest pooling
weight. Run: python benchmarks/tile_effects_error.py [--tiles 200] [--sharpen 1 8 30]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from wsi.core.errors import ConfigError
from wsi.models.explain.attribution import Method, tile_effects
from wsi.models.explain.leave_one_out import reforward_leave_one_out
from wsi.models.presets import build_model

WIDTHS = {"dim": 32, "attn_dim": 32, "heads": 4, "mlp_dim": 64, "depth": 2, "in_dim": 16, "num_classes": 2}
KINDS = [
    *(f"{a}-gated" for a in ("seqnorm", "sima", "softmax", "gdla")),
    *(f"{a}-cls" for a in ("seqnorm", "sima", "softmax", "gdla")),
    "abmil",
]


def peaked_model(kind: str, sharpen: float, seed: int = 0) -> torch.nn.Module:
    """A float64 model of `kind` (e.g. 'seqnorm-gated', 'abmil') with its readout sharpened."""
    torch.manual_seed(seed)
    if kind == "abmil":
        m = build_model("abmil", in_dim=WIDTHS["in_dim"], hidden_dim=32, attn_dim=16, num_classes=2)
    else:
        attention, readout = kind.rsplit("-", 1)
        pool = {"pool": "gated", "pool_dim": 16, "attn_layer_scale": 0.5} if readout == "gated" else {}
        m = build_model("vit-wsi", attention=attention, **WIDTHS, **pool)
    m = m.double().eval()
    with torch.no_grad():
        if getattr(m, "pool", None) is not None:
            m.pool.attn_w.weight.mul_(sharpen)
        for blk in [] if kind == "abmil" else m.transformer.layers():  # every block's queries
            qkv = blk.attn.to_qkv  # (seqnorm and sima normalise Q: unchanged; softmax, gdla: sharper)
            qkv.weight[: qkv.weight.shape[0] // 3].mul_(sharpen)
    return m


def bag(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    side = int(n**0.5) + 4
    cells = torch.randperm(side * side, generator=g)[:n]
    coords = torch.stack([cells % side, cells // side], -1).double()[None] * 256.0
    return torch.randn(1, n, WIDTHS["in_dim"], generator=g, dtype=torch.float64), coords


def top_weight(m: Any, x: torch.Tensor, coords: torch.Tensor) -> float:
    if getattr(m, "pool", None) is None:
        return float("nan")
    with torch.no_grad():
        h = m._embed(x, None) if m.config.kind == "abmil" else m.tile_tokens(x, None, coords)
        return float(m.pool.weights(m.pool.scores(h), None).max())


def relative_error(effects: torch.Tensor, loo: torch.Tensor) -> float:
    return float((effects - loo).norm() / loo.norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiles", type=int, default=200)
    ap.add_argument("--sharpen", type=float, nargs="+", default=[1.0, 8.0, 30.0])
    args = ap.parse_args()
    print(f"{'kind':16} {'sharpen':>7} {'top a':>6} {'gradient':>9} {'pooled':>7} {'auto (large bag)':>17}")
    methods: tuple[Method, ...] = ("gradient", "pooled", "auto")
    for kind in KINDS:
        for s in args.sharpen:
            m = peaked_model(kind, s)
            x, coords = bag(args.tiles)
            loo = reforward_leave_one_out(m, x, None, coords)[0]
            row = []
            for method in methods:
                try:
                    eff = tile_effects(m, x, coords_um=coords, method=method, exact_max_tiles=args.tiles - 1)
                    row.append(f"{relative_error(eff[0], loo):.3f}")
                except ConfigError:
                    row.append("refused")
            print(f"{kind:16} {s:7.0f} {top_weight(m, x, coords):6.2f} {row[0]:>9} {row[1]:>7} {row[2]:>17}")


if __name__ == "__main__":
    main()

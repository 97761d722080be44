"""One TransMIL training step on the CPU: the Nystrom attention on the reduced landmark matrix (ours)
beside the authors' full (m, m) computation, side by side in one run (issue 32).

A bag of n tiles is n + 1 tokens (class token) padded to a square, then front-padded to a multiple of
the 256 landmarks; below 256 tokens most landmarks are made of padding only. lucidrains'
NystromAttention (what TransMIL imports) still runs the 6-iteration pseudo-inverse of eight (256, 256)
matrices per layer on them; `models.baselines.nystrom` runs the same polynomial on the matrix with those
landmarks as one index (and skips the padding rows the authors drop). `FullNystrom` below is the authors'
computation with our parameters, so both columns are the same model with the same weights; the
script prints the largest logit difference between them as a check.

    python benchmarks/transmil_step.py                          # bags of 10 .. 1,000 tiles, 708-d
    python benchmarks/transmil_step.py --tiles 36 300 --in-dim 1024 --steps 5

Each figure: the median over `--steps` steps (forward, backward, AdamW step) after one warm-up,
1 torch thread unless --threads. Prints a table; logs nothing else.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from _machine import cpu_model
from wsi.models import build_model
from wsi.models.baselines.nystrom import NystromAttention, iterative_pinv


class FullNystrom(NystromAttention):
    """The authors' computation: every padding row and landmark, the (m, m) pseudo-inverse."""

    def forward(self, x: Tensor) -> Tensor:
        n, m = x.shape[1], self.landmarks
        pad = (-n) % m
        x = F.pad(x, (0, 0, pad, 0))
        q, k, v = (
            t.unflatten(-1, (self.heads, self.dim_head)).transpose(1, 2) for t in self.to_qkv(x).chunk(3, -1)
        )
        q, k, v = q.float() * self.scale, k.float(), v.float()
        b, h, big_n, d = q.shape
        ql = q.reshape(b, h, m, big_n // m, d).sum(3) / (big_n // m)
        kl = k.reshape(b, h, m, big_n // m, d).sum(3) / (big_n // m)
        inv = iterative_pinv(torch.softmax(ql @ kl.transpose(-1, -2), -1), self.iters)
        out = (torch.softmax(q @ kl.transpose(-1, -2), -1) @ inv) @ (
            torch.softmax(ql @ k.transpose(-1, -2), -1) @ v
        )
        out = out + F.conv2d(
            v, self.res_conv.weight.float(), padding=self.res_conv.padding, groups=self.heads
        )
        return self.drop(self.to_out(out.transpose(1, 2).flatten(2).to(x.dtype)))[:, -n:]


def full_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of a TransMIL whose two attention layers compute as the authors' code does."""
    full = copy.deepcopy(model)
    for layer in (full.layer1, full.layer2):  # type: ignore[attr-defined]
        layer.attn.__class__ = FullNystrom
    return full


def step_seconds(model: torch.nn.Module, x: Tensor, steps: int) -> float:
    """Median seconds of one training step (forward, cross-entropy, backward, AdamW) after a warm-up;
    lr 0, so the two models keep equal weights for the next bag size's logit check."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)  # the full step's cost; weights unchanged
    y = torch.tensor([1])
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(tiles: Sequence[int], in_dim: int, steps: int) -> list[tuple[int, int, float, float, float]]:
    """(tiles, reduced matrix rows, full s, ours s, max |logit difference|) per bag size."""
    torch.manual_seed(0)
    ours = build_model("transmil", in_dim=in_dim, num_classes=2)
    full = full_model(ours)
    rows = []
    for n in tiles:
        x = torch.randn(1, n, in_dim)
        ours.eval(), full.eval()
        with torch.no_grad():
            diff = float((ours(x) - full(x)).abs().max())
        ours.train(), full.train()
        side = ours.side(n)  # type: ignore[operator]
        tokens, m = 1 + side * side, ours.config.landmarks  # type: ignore[union-attr]
        pad = (-tokens) % m
        seg = (tokens + pad) // m
        reduced = m - max(pad // seg - 1, 0)
        rows.append((n, reduced, step_seconds(full, x, steps), step_seconds(ours, x, steps), diff))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiles", nargs="*", type=int, default=[10, 36, 60, 150, 300, 1000])
    ap.add_argument("--in-dim", type=int, default=708, help="feature width (UCSB breast cancer: 708)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per figure (median)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = run(args.tiles, args.in_dim, args.steps)
    print(
        f"\nTransMIL training step, {args.in_dim}-d features, {args.threads} torch thread(s); {cpu_model()}\n"
    )
    print("| tiles | pinv rows (authors: 256) | authors' full s | ours s | ratio | max logit diff |")
    print("|---|---|---|---|---|---|")
    for n, reduced, full_s, ours_s, diff in rows:
        print(f"| {n} | {reduced} | {full_s:.3f} | {ours_s:.3f} | {full_s / ours_s:.1f}x | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["FullNystrom", "full_model", "main", "run"]

"""Time and memory of one slide embedding at 10,000 and 100,000 tiles, every slide encoder, on the CPU.

Each point runs in a fresh process, so its peak resident set belongs to that point alone. `base` is the
resident set once the interpreter, torch, the encoder and the bag (float16, as `wsi embed` stores it)
are loaded; `extra` = peak - base is what the embedding itself costs. `--one-pass` sets the chunk to N
(the whole bag scored at once, as the authors' code does) to show what the chunking saves. A GPU, when
given (`--device cuda`), reports torch.cuda.max_memory_allocated instead.

    python benchmarks/slide_encoder_throughput.py                    # the table in docs/benchmarks.md
    python benchmarks/slide_encoder_throughput.py --one-pass         # the authors' one-pass memory
    python benchmarks/slide_encoder_throughput.py --tiles 1000 --encoders chief   # smoke run
    python benchmarks/slide_encoder_throughput.py --encoders gigapath --depth 1   # 1 LongNet layer

`--depth K` keeps the first K transformer layers of encoders that have them (Prov-GigaPath): layers run
one after the other and free their activations, so the peak memory is the full model's and the time
scales with the number of layers (gigapath runs 11 of its 12).
    python benchmarks/slide_encoder_throughput.py --encoders titan --tiles 10000
    python benchmarks/slide_encoder_throughput.py --encoders titan:tiny            # 10k and 100k on a CPU

TITAN's attention is O(N^2): the published config (6 layers, 768 wide) needs hours for 100,000 tiles on
2 CPU cores, so `titan:tiny` (the same code: 1 layer, 64 wide, 4 heads, random weights) shows its memory
and scaling there; `--one-pass` gives TITAN the authors' dense (heads, N+1, N+1) ALiBi bias.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

#: `titan:tiny`: TITAN's code with a small config, for 100,000 tiles on a CPU
TITAN_TINY = {"dim": 64, "depth": 1, "heads": 4, "pool_heads": 4}


def _rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def _point(
    name: str, n: int, device: str, one_pass: bool, threads: int, depth: int | None, out: mp.Queue
) -> None:
    import torch

    from wsi.models import slide_encoders
    from wsi.models.slide_encoders import base, build_slide_encoder, get_spec, titan

    torch.set_num_threads(threads)
    spec = get_spec(name.split(":")[0])
    if name == "titan:tiny":
        torch.manual_seed(0)
        model = titan.Titan(**TITAN_TINY).requires_grad_(False).eval().to(device)
    else:
        model = build_slide_encoder(name, random_init=True).to(device)
    layers = getattr(getattr(model, "encoder", None), "layers", None)
    if depth is not None and layers is not None:
        model.encoder.layers = layers[:depth]
    g = torch.Generator().manual_seed(0)
    feats = torch.empty(n, spec.in_dim, dtype=torch.float16)
    for i in range(0, n, 4096):  # filled in blocks: no float32 copy of the bag raises the high-water mark
        feats[i : i + 4096] = torch.randn(min(4096, n - i), spec.in_dim, generator=g)
    feats = feats.to(device)
    # tiles on a grid of their own size, 2/3 of the cells of a square filled (a tissue mask)
    side = int((n * 1.5) ** 0.5) + 1
    cells = torch.randperm(side * side, generator=g)[:n]
    coords = (torch.stack([cells // side, cells % side], 1).float() * spec.tile_um).to(device)
    if one_pass:
        base.CHUNK_TILES = n
        titan.SCORE_BYTES = 1 << 62  # every query row at once: the dense bias of the authors' code
    del slide_encoders
    model.encode(feats[:64], coords[:64], spec.tile_um)  # warm-up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base_mb = _rss_mb()
    start = time.perf_counter()
    z = model.encode(feats, coords, spec.tile_um)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if device.startswith("cuda"):
        extra = torch.cuda.max_memory_allocated() / 2**20 - feats.numel() * 2 / 2**20
    else:
        extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base_mb
    out.put({"encoder": name, "tiles": n, "seconds": seconds, "base_mb": base_mb, "extra_mb": extra,
             "bag_mb": feats.numel() * 2 / 2**20, "finite": bool(torch.isfinite(z).all())})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiles", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--encoders", nargs="+", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--depth",
        type=int,
        default=None,
        help="Keep the first K transformer layers (LongNet encoders); see above.",
    )
    parser.add_argument("--one-pass", action="store_true", help="Score the whole bag at once (no chunks).")
    args = parser.parse_args()
    from _machine import cpu_model
    from wsi.models.slide_encoders import CHUNK_TILES, SLIDE_ENCODERS

    # the published TITAN takes hours at 100,000 tiles on a CPU: by default its tiny config stands in
    names = args.encoders or [n for n in SLIDE_ENCODERS.names() if n != "titan"] + ["titan:tiny"]
    ctx = mp.get_context("spawn")
    rows = []
    for name in names:
        for n in args.tiles:
            q: mp.Queue = ctx.Queue()
            p = ctx.Process(
                target=_point,
                args=(name, n, args.device, args.one_pass, args.threads, args.depth, q),
            )
            p.start()
            p.join()
            if p.exitcode != 0:
                print(f"{name} at {n} tiles: exit {p.exitcode}", file=sys.stderr)
                continue
            rows.append(q.get())
    chunk = "one pass" if args.one_pass else f"chunks of {CHUNK_TILES}"
    depth = f", first {args.depth} transformer layer(s)" if args.depth else ""
    print(f"\n{args.device} ({cpu_model()}, {args.threads} threads), {chunk}{depth}, float16 bags\n")
    print("| encoder | tiles | time (s) | tiles/s | bag (MB) | base RSS (MB) | extra peak (MB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['encoder']} | {r['tiles']:,} | {r['seconds']:.2f} | {r['tiles'] / r['seconds']:,.0f} | "
              f"{r['bag_mb']:.0f} | {r['base_mb']:.0f} | {r['extra_mb']:.0f} |")  # fmt: skip
        if not r["finite"]:
            print(f"  ({r['encoder']}: NON-FINITE embedding)")


if __name__ == "__main__":
    main()

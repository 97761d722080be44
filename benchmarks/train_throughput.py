"""Training throughput: seconds per epoch and peak memory for 1,000 bags like TCGA-NSCLC, per attention.

Bag lengths follow a log-normal with median 3,000 tiles, clipped to [200, 11,000] (TCGA-NSCLC at 256 um:
median about 3,000, maximum about 11,000), 2048-d features (RetCCL), batch size 1, whole bags, full-size
vit-wsi preset. Bags are views into one in-memory float16 pool (no files), so the figure is the training
loop itself: host -> device copy of every bag (pinned memory), forward, backward and AdamW step, through
the project's own `pipelines.train.loop.train_epoch` (bf16 autocast on CUDA, one host sync per epoch).

Each variant runs in a fresh process, so the CPU peak (resident set of the whole process) is its own; on
a GPU the peak is torch.cuda.max_memory_allocated. With fewer bags than 1,000 (--quick, or --bags N) the
epoch time is extrapolated per tile to the 1,000-bag length set and the table says so.

    python benchmarks/train_throughput.py --quick --device cpu      # a few bags per variant, CPU
    python benchmarks/train_throughput.py --device cuda             # 1,000 bags per variant, GPU
    python benchmarks/train_throughput.py --small-bags              # wsi train vs a plain loop, Musk1-like

Writes train_throughput_<device>.csv into --out (default docs/) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path
from typing import Any

from wsi.core.files import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("train_throughput")
VARIANTS = ("seqnorm", "softmax", "sima", "gdla")
FIELDS = (
    "device", "attention", "bags", "tiles", "seconds", "epoch_1000_s", "extrapolated", "bags_per_s",
    "peak_mem_mb",
)  # fmt: skip
IN_DIM = 2048
MEDIAN, LO, HI, SIGMA = 3000, 200, 11000, 0.55


def bag_lengths(n: int, seed: int = 0) -> list[int]:
    """TCGA-NSCLC-like tile counts: log-normal around the median, clipped; the longest is always HI."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(MEDIAN * np.exp(SIGMA * rng.standard_normal(n))), LO, HI).astype(int)
    lengths[int(rng.integers(n))] = HI  # every epoch meets one maximal bag, as a real cohort does
    return lengths.tolist()


def _run_variant(cfg: dict[str, Any], out: mp.Queue) -> None:
    import torch

    from wsi.models.presets import build_model
    from wsi.pipelines.inputs.bag_dataset import collate_bags
    from wsi.pipelines.train.loop import train_epoch

    try:
        torch.set_num_threads(cfg["threads"])
        device = torch.device(cfg["device"])
        torch.manual_seed(0)
        cuda = device.type == "cuda"
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        lengths = cfg["lengths"]
        # one pool; bag i is the slice pool[offset_i : offset_i + n_i] (a view, no copy)
        pool = torch.randn(HI + 1024, IN_DIM).to(torch.float16)  # (N_pool, D)
        coords = torch.rand(HI + 1024, 2) * 50_000.0  # (N_pool, 2) um
        if cuda:
            pool, coords = pool.pin_memory(), coords.pin_memory()
        gen = torch.Generator().manual_seed(1)
        offsets = torch.randint(0, 1024, (len(lengths),), generator=gen).tolist()
        samples = [
            {"x": pool[o : o + n], "coords_um": coords[o : o + n], "label": i % 2, "id": f"bag{i}"}
            for i, (o, n) in enumerate(zip(offsets, lengths, strict=True))
        ]
        loader = torch.utils.data.DataLoader(
            samples, batch_size=1, shuffle=False, collate_fn=collate_bags, pin_memory=cuda
        )
        model = build_model("vit-wsi", attention=cfg["attention"], in_dim=IN_DIM, num_classes=2).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-2, fused=cuda or None)
        warm = torch.utils.data.DataLoader(
            samples[:2], batch_size=1, collate_fn=collate_bags, pin_memory=cuda
        )
        train_epoch(model, warm, opt, None, device=device)  # kernels, allocator, autotuning
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        train_epoch(model, loader, opt, None, device=device)  # ends in .item(): synchronised
        seconds = time.perf_counter() - t0
        if cuda:
            peak = torch.cuda.max_memory_allocated(device) / 2**20
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
        out.put({"ok": True, "seconds": seconds, "peak_mem_mb": peak})
    except Exception as exc:  # reported in the table, the other variants still run
        out.put({"ok": False, "error": f"{type(exc).__name__}: {exc}"})


def measure(attention: str, *, device: str, lengths: list[int], threads: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    cfg = {"attention": attention, "device": device, "lengths": lengths, "threads": threads}
    proc = ctx.Process(target=_run_variant, args=(cfg, q))
    proc.start()
    result = q.get()
    proc.join()
    return result


def main(argv: list[str] | None = None) -> None:
    import torch

    args_in = sys.argv[1:] if argv is None else argv
    if "--small-bags" in args_in:  # the loop's own overhead: benchmarks/train_overhead.py
        from train_overhead import main as overhead

        overhead([a for a in args_in if a != "--small-bags"])
        return

    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default=default_device)
    ap.add_argument("--quick", action="store_true", help="6 bags per variant (extrapolated to 1,000)")
    ap.add_argument("--bags", type=int, default=None, help="bags per epoch (default 1,000; --quick: 6)")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--threads", type=int, default=max(1, torch.get_num_threads()), help="CPU threads")
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    full = bag_lengths(1000)
    n_bags = args.bags or (6 if args.quick else 1000)
    # fewer bags: evenly spaced quantiles of the 1,000 lengths, so the sample looks like the cohort
    ranked = sorted(full)
    lengths = full if n_bags >= 1000 else [ranked[int((i + 0.5) * 1000 / n_bags)] for i in range(n_bags)]
    total_tiles = sum(full)
    rows = []
    for attention in args.variants:
        log.info("%s: %d bags, %d tiles on %s ...", attention, len(lengths), sum(lengths), args.device)
        res = measure(attention, device=args.device, lengths=lengths, threads=args.threads)
        row: dict[str, Any] = {"device": args.device, "attention": attention, "bags": len(lengths),
                               "tiles": sum(lengths), "extrapolated": len(lengths) != 1000}  # fmt: skip
        if res["ok"]:
            sec = res["seconds"]
            row.update(
                seconds=round(sec, 3),
                epoch_1000_s=round(sec * total_tiles / sum(lengths), 1),
                bags_per_s=round(len(lengths) / sec, 2),
                peak_mem_mb=round(res["peak_mem_mb"], 1),
            )
        else:
            log.warning("%s failed: %s", attention, res["error"])
            row.update(seconds="failed", epoch_1000_s="", bags_per_s="", peak_mem_mb="")
        rows.append(row)

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    out_csv = args.out / f"train_throughput_{args.device}.csv"
    write_text_atomic(out_csv, buf.getvalue())
    print(f"\n1,000-bag cohort: {total_tiles:,} tiles (median {sorted(full)[500]:,}, max {max(full):,})")
    print("| attention | bags timed | tiles timed | seconds | s / epoch of 1,000 bags | bags/s | peak MB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        est = f"{r['epoch_1000_s']}{' (extrapolated)' if r['extrapolated'] else ''}"
        cells = [r["attention"], r["bags"], f"{r['tiles']:,}", r["seconds"], est]
        cells += [r["bags_per_s"], r["peak_mem_mb"]]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print(f"\nCSV: {out_csv}")


if __name__ == "__main__":
    main()

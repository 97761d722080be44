"""Fig. 2 of the paper for images: ViT2D forward + backward time and peak memory against image size.

Batch 1 at 224, 512, 1024 and 2048 px (196 to 16,384 tokens of 16x16 px) for every attention variant,
with the vit-2d preset (paper widths). Each measurement runs in a fresh process so that the CPU peak
(resident set) belongs to that configuration alone and a run past `--budget-s` can be stopped (the
process runner is attention_scaling.py's); once a variant runs out of time or memory or fails, its
larger sizes are skipped too (they would only take longer).

    python benchmarks/image_scaling.py --quick                       # CPU smoke run, seconds
    python benchmarks/image_scaling.py --device cpu --budget-s 120   # the CPU table in docs/benchmarks.md
    python benchmarks/image_scaling.py --device cuda --bf16          # the GPU figure

Writes image_scaling_<device>.csv and .png into --out and prints a markdown table. On the CPU the
table and plot give the process's CPU time (all threads), which other work on a shared machine inflates
far less than the wall time (also in the CSV); on CUDA, wall time after synchronisation.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from attention_scaling import run_in_process  # benchmarks/attention_scaling.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
SIZES_PX = (224, 512, 1024, 2048)
PATCH_PX = 16
FIELDS = (
    "attention",
    "size_px",
    "tokens",
    "status",
    "fwd_bwd_ms",
    "cpu_ms",
    "peak_mem_mb",
    "device",
    "dtype",
    "threads",
)


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _measure(cfg: dict[str, Any], out: mp.Queue) -> None:
    """Child process: build the model, time `repeats` forward+backward steps, report the peak memory.
    Always puts one result: status ok, oom, or "failed: <error>", so the parent never waits it out."""
    import torch

    from wsi.models import build_model

    try:
        torch.set_num_threads(cfg["threads"])
        device = torch.device(cfg["device"])
        model = build_model("vit-2d", attention=cfg["attention"], num_classes=2, **cfg["overrides"])
        model = model.to(device)
        x = torch.randn(1, 3, cfg["size_px"], cfg["size_px"], device=device)  # (B, C, H, W)
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if cfg["bf16"] else nullcontext()

        def step() -> None:
            with autocast:
                loss = model(x).float().logsumexp(-1).sum()
            loss.backward()
            model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        base_mb = _rss_mb()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base_mb = torch.cuda.memory_allocated(device) / 2**20
        step()  # warm-up: allocator, kernels
        times, cpu_times = [], []
        for _ in range(cfg["repeats"]):
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)  # all threads' CPU seconds: robust to a busy machine
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device) / 2**20 - base_mb
        else:  # ru_maxrss: KiB on Linux; the process's high-water mark above its size before the first step
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10 - base_mb
        out.put(
            {
                "status": "ok",
                "fwd_bwd_ms": statistics.median(times) * 1e3,
                "cpu_ms": statistics.median(cpu_times) * 1e3,
                "peak_mem_mb": peak,
            }
        )
    except (torch.cuda.OutOfMemoryError, MemoryError):
        out.put({"status": "oom"})
    except Exception as exc:  # a failed point is a table entry, not the end of the run
        out.put({"status": f"failed: {type(exc).__name__}: {exc}"[:120]})


def run_one(cfg: dict[str, Any], budget_s: float) -> dict[str, Any]:
    """One configuration in a spawned process; status ok | timeout | oom | failed: <error> | died (exit N)."""
    result = run_in_process(_measure, cfg, budget_s)
    if result["status"].startswith("timeout"):
        result["status"] = "timeout"
    return result


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    overrides = {"depth": 2, "dim": 256, "attn_dim": 256, "mlp_dim": 256} if args.quick else {}
    for attention in args.attention:
        stopped = ""
        for size in args.sizes:
            tokens = (size // PATCH_PX) ** 2
            row: dict[str, Any] = {
                "attention": attention, "size_px": size, "tokens": tokens, "device": args.device,
                "dtype": "bf16" if args.bf16 else "fp32", "fwd_bwd_ms": "", "cpu_ms": "", "peak_mem_mb": "",
                "threads": args.threads,
            }  # fmt: skip
            if stopped:
                row["status"] = f"skipped ({stopped} at a smaller size)"
            else:
                cfg = {
                    "attention": attention, "size_px": size, "device": args.device, "bf16": args.bf16,
                    "repeats": args.repeats, "threads": args.threads, "overrides": overrides,
                }  # fmt: skip
                result = run_one(cfg, args.budget_s)
                row.update(result)
                if result["status"] != "ok":
                    stopped = result["status"].split(":")[0]  # "failed: <error>" -> "failed" in the note
                    if stopped == "timeout":
                        row["status"] = f"timeout (> {args.budget_s:.0f} s)"
            rows.append(row)
            print(f"{attention:8s} {size:5d} px {tokens:6d} tokens: {_fmt(row)}", file=sys.stderr, flush=True)
    return rows


def _fmt(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return row["status"]
    return f"{row['fwd_bwd_ms']:.0f} ms wall, {row['cpu_ms']:.0f} ms CPU, {row['peak_mem_mb']:.0f} MB"


def markdown(rows: list[dict[str, Any]]) -> str:
    """One row per size, one column per variant: 'time / peak MB'. On the CPU the time is the process's
    CPU time (all threads), which a machine shared with other work inflates far less than wall time."""
    variants = list(dict.fromkeys(r["attention"] for r in rows))
    sizes = list(dict.fromkeys((r["size_px"], r["tokens"]) for r in rows))
    on_cpu = all(r["device"] == "cpu" for r in rows)
    key, unit = ("cpu_ms", "CPU s") if on_cpu else ("fwd_bwd_ms", "s")
    lines = [
        "| image (px) | tokens | " + " | ".join(f"{v}: {unit} / peak MB" for v in variants) + " |",
        "|---|---|" + "---|" * len(variants),
    ]
    for size, tokens in sizes:
        cells = []
        for v in variants:
            r = next(r for r in rows if r["attention"] == v and r["size_px"] == size)
            cells.append(
                f"{r[key] / 1e3:.2f} / {r['peak_mem_mb']:.0f}" if r["status"] == "ok" else r["status"]
            )
        lines.append(f"| {size} | {tokens:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_outputs(rows: list[dict[str, Any]], out_dir: Path, device: str) -> tuple[Path, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wsi.core.files import atomic_path

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out_dir / f"image_scaling_{device}.csv", out_dir / f"image_scaling_{device}.png"
    with atomic_path(csv_path) as tmp, tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore", restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: f"{v:.1f}" if isinstance(v, float) else v for k, v in r.items()} for r in rows)

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    for v in dict.fromkeys(r["attention"] for r in rows):
        ok = [r for r in rows if r["attention"] == v and r["status"] == "ok"]
        if ok:
            key = "cpu_ms" if device == "cpu" else "fwd_bwd_ms"
            ax_t.plot([r["tokens"] for r in ok], [r[key] / 1e3 for r in ok], "o-", label=v)
            ax_m.plot([r["tokens"] for r in ok], [r["peak_mem_mb"] / 1024 for r in ok], "o-", label=v)
    time_label = "forward + backward, CPU time (s)" if device == "cpu" else "forward + backward (s)"
    for ax, ylabel in ((ax_t, time_label), (ax_m, "peak memory (GiB)")):
        ax.set(xscale="log", yscale="log", xlabel="tokens (16x16 px patches)", ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"ViT2D (vit-2d), batch 1, {device}")
    fig.tight_layout()
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return csv_path, png_path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    import torch

    from wsi.models import list_attention

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    p.add_argument("--attention", nargs="+", default=list_attention(), help="variants (default: all)")
    p.add_argument("--sizes", nargs="+", type=int, default=list(SIZES_PX), help="image sizes in px")
    p.add_argument("--repeats", type=int, default=3, help="timed steps after one warm-up (median)")
    p.add_argument(
        "--budget-s", type=float, default=120.0, help="per configuration; larger sizes then skipped"
    )
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU; also runs on CPU)")
    p.add_argument(
        "--quick", action="store_true", help="tiny model (depth 2, width 256), 224 and 512 px, 1 repeat"
    )
    p.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the CSV and PNG")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda asked for, but CUDA is not available here")
    if args.quick:
        args.sizes, args.repeats = [s for s in args.sizes if s <= 512], 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rows = run(args)
    csv_path, png_path = write_outputs(rows, args.out, args.device)
    print(markdown(rows))
    print(f"\nwrote {csv_path} and {png_path}", file=sys.stderr)


if __name__ == "__main__":
    main()

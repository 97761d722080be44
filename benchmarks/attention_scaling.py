"""The paper's scaling experiment: time and peak memory against sequence length, every variant.

`--mode train` (default): one forward + backward step, batch 1, with MILTransformer (preset vit-wsi,
2048-d tile features) and ViT2D (preset vit-2d, an image of N 16x16 patches). `--mode infer`: one
no-grad forward of vit-wsi over a bag read chunk by chunk (`logits_from_chunks`, float16 features as
from disk), up to a million tiles. Models keep their defaults (chunked inference and activation
checkpointing above 16,384 tokens) unless `--plain`. Each point runs in a fresh process, so the CPU peak
(resident set, whole process) belongs to that point alone; `base` is the resident set before the step
(interpreter, torch, model, inputs), so (peak - base) / tokens is the memory per token of the step. On a
GPU the peak is torch.cuda.max_memory_allocated. Sizes a variant would not finish within --budget-s
(estimated from its previous sizes) are skipped and marked so in the table.

    python benchmarks/attention_scaling.py --quick                        # smoke run, a minute on CPU
    python benchmarks/attention_scaling.py --device cpu --budget-s 150    # CPU table, docs/benchmarks.md
    python benchmarks/attention_scaling.py --device cuda --bf16           # GPU, bf16 autocast
    python benchmarks/attention_scaling.py --mode infer --device cpu --threads 1 --budget-s 900

Writes attention_scaling_<device>[_infer].csv and .png into --out (default docs/) and prints a markdown
table followed by the paper's expectations (seqnorm time(65,536)/time(16,384); softmax/seqnorm at 32,768).
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing as mp
import os
import queue
import resource
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from scaling_report import MODELS, VARIANTS, expectations, fmt_row, markdown, plot, read_rows, write_csv

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("attention_scaling")
SIZES = (196, 1024, 4096, 16384, 32768, 65536, 131072)
INFER_SIZES = (16384, 100_000, 1_000_000)
QUICK_SIZES = (196, 1024, 4096)


def _rss_mb() -> float:
    """Resident set now (not the peak), MB; Linux /proc."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _memory(device: Any, base_mb: float, tokens: int) -> dict[str, Any]:
    import torch

    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # kB -> MB
    return {"peak_mem_mb": peak, "base_mem_mb": base_mb, "kb_per_token": (peak - base_mb) * 1024 / tokens}


def _build(cfg: dict[str, Any]) -> Any:
    from wsi.models.presets import build_model

    preset = "vit-wsi" if cfg["model"] == "mil" else "vit-2d"
    plain = {"chunk_above_tokens": None, "checkpoint_above_tokens": None} if cfg.get("plain") else {}
    return build_model(preset, attention=cfg["attention"], num_classes=2, **plain)


def _measure_infer(cfg: dict[str, Any], out: mp.Queue) -> None:
    """Child process: a no-grad forward of one bag streamed in chunks of float16 features."""
    import torch

    try:
        torch.set_num_threads(cfg["threads"])
        device = torch.device(cfg["device"])
        torch.manual_seed(0)
        model = _build(cfg).to(device).eval()
        n, read = cfg["tokens"], 16384
        block = torch.randn(min(n, read), 2048, device=device).half()  # one block, read again and again
        side = math.isqrt(n - 1) + 1  # tiles on a square grid

        def chunks(n: int) -> Any:
            for start in range(0, n, read):
                cells = torch.arange(start, min(start + read, n), device=device)
                yield block[: len(cells)], torch.stack([cells % side, cells // side], -1).float() * 256.0

        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if cfg["bf16"] else nullcontext()
        with torch.no_grad(), autocast:
            model.logits_from_chunks(chunks(64), n_tiles=64)  # warm up, untimed
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else _rss_mb()
            t0 = time.perf_counter()
            model.logits_from_chunks(chunks(n), n_tiles=n).float().cpu()
            seconds = time.perf_counter() - t0
        out.put({"status": "ok", "fwd_bwd_s": seconds, **_memory(device, base, n)})
    except (torch.cuda.OutOfMemoryError, MemoryError):
        out.put({"status": "oom"})
    except Exception as exc:  # a failed point is a table entry, not the end of the run
        out.put({"status": f"failed: {type(exc).__name__}: {exc}"[:120]})


def grid_for(tokens: int) -> tuple[int, int]:
    """Patch grid (h, w) with h * w == tokens and h the largest divisor not above sqrt(tokens)."""
    h = max(d for d in range(1, math.isqrt(tokens) + 1) if tokens % d == 0)
    return h, tokens // h


def _measure(cfg: dict[str, Any], out: mp.Queue) -> None:
    """Child process: build the model, time forward+backward, report the peak memory."""
    import torch

    try:
        torch.set_num_threads(cfg["threads"])
        device = torch.device(cfg["device"])
        torch.manual_seed(0)
        model = _build(cfg).to(device)
        if cfg.get("compile"):  # fuses the small elementwise kernels; one compile per token count
            model = torch.compile(model, dynamic=False)

        def inputs(tokens: int) -> torch.Tensor:
            if cfg["model"] == "mil":
                return torch.randn(1, tokens, 2048, device=device)  # (B, N, 2048) one bag
            h, w = grid_for(tokens)
            return torch.randn(1, 3, 16 * h, 16 * w, device=device)  # (B, 3, H, W): N = h * w patches

        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if cfg["bf16"] else nullcontext()

        def step(x: torch.Tensor) -> float:
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            with autocast:
                loss = model(x).float().logsumexp(-1).sum()
            loss.backward()
            model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                end.record()
                torch.cuda.synchronize(device)
                return start.elapsed_time(end) / 1000.0
            return time.perf_counter() - t0

        x = inputs(cfg["tokens"])
        step(x if cfg.get("compile") else inputs(64))  # warm up (and compile), untimed
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else _rss_mb()
        times = [step(x)]
        if times[0] < cfg["budget_s"] / 20:  # fast points: median of a few more steps
            times = [step(x) for _ in range(cfg["repeats"])]
        memory = _memory(device, base, cfg["tokens"])
        out.put({"status": "ok", "fwd_bwd_s": statistics.median(times), **memory})
    except torch.cuda.OutOfMemoryError:
        out.put({"status": "oom"})
    except MemoryError:
        out.put({"status": "oom"})
    except Exception as exc:  # a failed point is a table entry, not the end of the run
        out.put({"status": f"failed: {type(exc).__name__}: {exc}"[:120]})


def run_point(cfg: dict[str, Any]) -> dict[str, Any]:
    target = _measure_infer if cfg.get("mode") == "infer" else _measure
    return run_in_process(target, cfg, cfg["budget_s"] * 3 + 120)


def run_in_process(
    target: Callable[[dict[str, Any], mp.Queue], None], cfg: dict[str, Any], limit: float
) -> dict[str, Any]:
    """`target(cfg, queue)` in a fresh spawned process, which must put one dict with a "status" on the
    queue; a child that dies silently (OOM killer) or runs past `limit` seconds becomes a status too.
    Shared with image_scaling.py."""
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(cfg, q))
    proc.start()
    deadline = time.monotonic() + limit
    res: dict[str, Any] | None = None
    while res is None:
        try:
            res = q.get(timeout=5)
        except queue.Empty:
            if not proc.is_alive():  # killed (e.g. by the OOM killer) without a word
                res = {"status": f"died (exit {proc.exitcode})"}
            elif time.monotonic() > deadline:
                res = {"status": f"timeout ({limit:.0f} s)"}
    proc.join(timeout=30)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if proc.exitcode not in (0, None) and res.get("status") == "ok":
        res = {"status": f"exit {proc.exitcode}"}
    return res


def estimate(done: list[tuple[int, float]], tokens: int, attention: str) -> float | None:
    """Time at `tokens` extrapolated from the measured sizes (exponent from the last two, in [1, 2])."""
    if not done:
        return None
    n1, t1 = done[-1]
    if len(done) >= 2:
        n0, t0 = done[-2]
        p = math.log(max(t1, 1e-6) / max(t0, 1e-6)) / math.log(n1 / n0)
    else:
        p = 2.0 if attention == "softmax" else 1.0
    # Noise at small sizes can make softmax look linear; its N^2 term dominates long before 65k tokens.
    p = min(max(p, 1.5 if attention == "softmax" else 1.0), 2.0)
    return t1 * (tokens / n1) ** p


def _series(
    args: argparse.Namespace,
    model: str,
    att: str,
    sizes: list[int],
    budget: float,
    dtype: str,
    measured: dict[tuple[str, str, int], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Measure one (model, variant) over the sizes, skipping those estimated above the budget."""
    rows: list[dict[str, Any]] = []
    done: list[tuple[int, float]] = []
    stop = False
    for n in sizes:
        if (model, att, n) in measured:  # --resume: measured before
            done.append((n, measured[model, att, n]["fwd_bwd_s"]))
            continue
        est = estimate(done, n, att)
        row: dict[str, Any] = {
            "mode": args.mode,
            "model": model,
            "attention": att,
            "tokens": n,
            "device": args.device,
            "dtype": dtype,
            "fwd_bwd_s": "",
            "peak_mem_mb": "",
            "est_s": "" if est is None else round(est, 1),
        }
        if stop or (est is not None and est > budget):
            row["status"] = "skipped"
            stop = True
        else:
            cfg = {
                "mode": args.mode,
                "model": model,
                "attention": att,
                "tokens": n,
                "device": args.device,
                "bf16": args.bf16,
                "compile": args.compile,
                "plain": args.plain,
                "threads": args.threads,
                "repeats": args.repeats,
                "budget_s": budget,
            }
            row.update(run_point(cfg))
            if row["status"] == "ok":
                done.append((n, row["fwd_bwd_s"]))
            else:
                stop = True  # out of memory or time: larger sizes would only be worse
        log.info("%s %s N=%d: %s", model, att, n, fmt_row(row))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_device = "cpu"
    try:
        import torch

        default_device = "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    parser.add_argument(
        "--mode",
        choices=("train", "infer"),
        default="train",
        help="train: forward + backward step; infer: no-grad forward of a streamed bag (mil)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default=default_device)
    parser.add_argument("--quick", action="store_true", help="sizes 196-4,096, short budget")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the CSV and PNG")
    parser.add_argument(
        "--sizes", type=int, nargs="+", help=f"token counts (default {SIZES}; infer {INFER_SIZES})"
    )
    parser.add_argument("--models", nargs="+", choices=MODELS, help="default: both (infer: mil)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument(
        "--budget-s", type=float, help="skip points estimated above this (default 60; quick 10)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed steps for fast points (median)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="switch off automatic chunking and checkpointing (the models' old defaults)",
    )
    parser.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 16))
    parser.add_argument("--resume", action="store_true", help="keep measured points of the CSV in --out")
    parser.add_argument("--compile", action="store_true", help="torch.compile each model (compile not timed)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    infer = args.mode == "infer"
    sizes = sorted(args.sizes or (QUICK_SIZES if args.quick else INFER_SIZES if infer else SIZES))
    models = args.models or (["mil"] if infer else list(MODELS))
    if infer and models != ["mil"]:
        parser.error("--mode infer streams a bag of tiles: --models mil")
    budget = args.budget_s or (10.0 if args.quick else 60.0)
    dtype = ("bf16-autocast" if args.bf16 else "float32") + ("+compile" if args.compile else "")
    dtype += "+plain" if args.plain else ""
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"attention_scaling_{args.device}{'_infer' if infer else ''}"
    csv_path = args.out / f"{stem}.csv"
    rows = read_rows(csv_path, args.device, dtype, args.mode) if args.resume else []
    measured = {(r["model"], r["attention"], r["tokens"]): r for r in rows}
    started = time.perf_counter()
    for model in models:
        for att in args.variants:
            rows += _series(args, model, att, sizes, budget, dtype, measured)
            write_csv(csv_path, rows)  # after every series: a long run that dies keeps its numbers

    write_csv(csv_path, rows)
    plot(rows, args.out / f"{stem}.png", args.device)
    print(markdown(rows))
    for line in expectations(rows):
        print(f"- {line}")
    ok = sum(r["status"] == "ok" for r in rows)
    log.info(
        "%d points measured, %d skipped/failed, %.0f s; wrote %s",
        ok,
        len(rows) - ok,
        time.perf_counter() - started,
        csv_path,
    )


if __name__ == "__main__":
    main()

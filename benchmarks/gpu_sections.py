"""The sections of benchmarks/gpu_suite.py: each measures one GPU figure of docs/benchmarks.md by calling
the existing benchmark scripts' functions, and hands every measurement to `emit` as soon as it has it
(so a section killed at its time budget keeps what it measured).

A row: section, name, measure, value, unit, status ("ok" or why not), detail. Sections run in a child
process of the suite (one per section, its own process group), never in the suite's own process.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_feed import section_decoders, section_feed, section_long

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

log = logging.getLogger("gpu_suite")
Emit = Callable[..., None]
# Aims set for the embed stage on one H100 (issue 12): end-to-end tiles/s
EMBED_AIMS = {"retccl": 10_000, "uni": 3_000, "uni2-h": 1_000}
AIM_ORDER = ("retccl", "uni", "uni2-h")  # measured first: they carry the aims


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sizes of every section: full (the GPU) or smoke (each section tiny, on the CPU)."""

    device: str
    precision: str  # bf16 autocast on CUDA
    encoders: tuple[str, ...]  # () = every named encoder, those with an aim first
    embed_tiles: int  # the most tiles one encoder's end-to-end run reads
    embed_seconds: float  # target length of the forward measurement
    end2end_seconds: float  # target length of the end-to-end run (longer: it includes the readers' start)
    slide_mm: float
    readers: int
    infer_sizes: tuple[int, ...]
    infer_variants: tuple[str, ...]
    point_budget_s: float  # one attention point; larger sizes estimated above it are skipped
    long_tokens: int  # the bag trained with checkpointing
    long_variants: tuple[str, ...]
    epoch_bags: int  # bags of the 1,000-bag length set (evenly spaced quantiles when fewer)
    epoch_max_tiles: int  # bags longer than this are cut (smoke only; the GPU run keeps whole bags)
    epoch_variants: tuple[str, ...]
    pytest_files: tuple[str, ...]


def make_plan(smoke: bool) -> Plan:
    cores = os.cpu_count() or 1
    if smoke:
        return Plan(
            device="cpu", precision="fp32", encoders=("timm:test_resnet",), embed_tiles=16,
            embed_seconds=0.5, end2end_seconds=0.5, slide_mm=1.0, readers=1, infer_sizes=(512, 2048),
            infer_variants=("seqnorm",), point_budget_s=30, long_tokens=2048, long_variants=("seqnorm",),
            epoch_bags=2, epoch_max_tiles=300, epoch_variants=("seqnorm",),
            pytest_files=("tests/pipelines/embed/test_gpu_decode.py",),
        )  # fmt: skip
    return Plan(
        device="cuda", precision="bf16", encoders=(),
        embed_tiles=20_000, embed_seconds=2.5, end2end_seconds=5.0, slide_mm=6.0,
        readers=max(1, min(8, cores - 1)), infer_sizes=(1_000_000,),
        infer_variants=("seqnorm", "sima", "gdla", "softmax"), point_budget_s=30, long_tokens=1_000_000,
        long_variants=("seqnorm",), epoch_bags=1000, epoch_max_tiles=11_000,
        epoch_variants=("seqnorm", "sima", "gdla"), pytest_files=(),
    )  # fmt: skip


# ------------------------------------------------------------------------------------------ gpu tests
def junit_rows(path: Path, emit: Emit, *, cuda: bool = True) -> None:
    """pytest's JUnit XML as a row: passed / failed / skipped counts, failures by name. With CUDA, every
    test skipped is a failure (the GPU tests did not run); without (the smoke run), the expected result."""
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    failed = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    passed = len(cases) - len(failed) - len(skipped)
    status = "ok" if not failed and passed else ("failed" if failed else "failed: no test ran")
    if skipped and not failed and not passed and not cuda:
        status = "skipped (no CUDA)"
    elif skipped and not failed and not passed:
        reason = skipped[0].find("skipped")
        status = f"failed: all skipped ({reason.get('message', '') if reason is not None else ''})"[:160]
    names = ", ".join(c.get("name", "?") for c in failed)[:300]
    emit("gpu-tests", "pytest -m gpu", "passed", passed, "tests", status,
         f"{len(failed)} failed, {len(skipped)} skipped" + (f": {names}" if names else ""))  # fmt: skip


def section_gpu_tests(plan: Plan, emit: Emit, *, junit: Path | None, budget_s: float) -> None:
    """The `gpu`-marked tests (nvjpeg against libjpeg, CUDA embedding with device decode, ...): read from
    the JUnit file of an earlier `pytest -m gpu` when given, otherwise run here."""
    if junit is None:
        junit = Path(tempfile.mkdtemp(prefix="gpu-tests-")) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *plan.pytest_files]  # fmt: skip
        done = subprocess.run(
            cmd, cwd=ROOT, timeout=max(10.0, budget_s - 5), check=False, capture_output=True, text=True
        )
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        if not junit.is_file():
            tail = " / ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            raise RuntimeError(f"pytest -m gpu exited {done.returncode} without a report: {tail}")
    if not junit.is_file():
        raise FileNotFoundError(f"no JUnit report at {junit}: did `pytest -m gpu --junitxml` run?")
    junit_rows(junit, emit, cuda=plan.device == "cuda")


# ---------------------------------------------------------------------------------------------- embed
def _slides(folder: Path, plan: Plan, decode: str) -> list[Any]:
    from embed_throughput import _slide_jobs

    slides, _ = _slide_jobs(folder, plan.slide_mm, plan.embed_tiles)
    return [dataclasses.replace(st, decode=decode) for st in slides]


def _first_tiles(slides: list[Any], n: int) -> list[Any]:
    """The slide jobs trimmed to n tiles in all (the last job cut short)."""
    out, left = [], n
    for st in slides:
        if left <= 0:
            break
        out.append(st if st.n <= left else dataclasses.replace(st, coords_px=st.coords_px[:left]))
        left -= out[-1].n
    return out


def section_embed(plan: Plan, emit: Emit) -> None:
    """Per named encoder (random weights): forward alone with FLOPs and MFU, then `embed_works` end to end;
    the feed (read + decode) once. Tile counts follow each encoder's forward rate (about
    plan.embed_seconds / plan.end2end_seconds), at most plan.embed_tiles."""
    import torch

    from embed_throughput import (
        ENCODERS,
        _options,
        flops_per_tile,
        measure_end2end,
        measure_forward,
        measure_read,
        peak_tflops,
        random_encoder,
    )  # fmt: skip
    from wsi.pipelines.embed.engine import prepare_runtime, resolve_decode

    logging.getLogger("wsi.models.encoders").setLevel(logging.ERROR)  # the random-init warning, on purpose
    device = torch.device(plan.device)
    cuda = device.type == "cuda"
    batch = 256 if cuda else 8
    peak = peak_tflops(torch.cuda.get_device_name(device), None) if cuda else None
    decode = resolve_decode("auto", device)
    args = argparse.Namespace(precision=plan.precision, compile=False, reader_mode="process", decode="auto")
    threads = os.cpu_count() or 1
    names = ENCODERS.names()
    encoders = plan.encoders or tuple(n for n in AIM_ORDER if n in names) + tuple(
        n for n in names if n not in AIM_ORDER
    )
    with tempfile.TemporaryDirectory(prefix="gpu-suite-embed-") as tmp:
        t0 = time.perf_counter()
        slides = _slides(Path(tmp), plan, decode)
        log.info("embed: slide written in %.1f s", time.perf_counter() - t0)
        n, s = measure_read(slides, batch_size=batch, readers=plan.readers, pin=cuda, mode="process",
                            device=device)  # fmt: skip
        read_rate = n / s
        emit("embed", "(all)", "read", round(read_rate, 1), "tiles/s", "ok",
             f"{n} tiles, decode {decode}, {plan.readers} readers")  # fmt: skip
        for name in encoders:
            try:
                flops = flops_per_tile(name)
                rt = prepare_runtime(random_encoder(name, device), device=device, precision=plan.precision,
                                     compile=False, threads=threads, batch_size=batch)  # fmt: skip
                n, s = measure_forward(rt, batch_size=batch, n_tiles=batch)  # warm-up and a first rate
                tiles = min(
                    plan.embed_tiles, max(2 * batch, int(n / s * plan.embed_seconds) // batch * batch)
                )
                n, s = measure_forward(rt, batch_size=batch, n_tiles=tiles)
                fwd = n / s
                tflops = fwd * flops / 1e12
                mfu = f", MFU {tflops / peak:.3f} of {peak:g}" if peak else ""
                emit(
                    "embed",
                    name,
                    "forward",
                    round(fwd, 1),
                    "tiles/s",
                    "ok",
                    f"{n} tiles, batch {batch}, {flops / 1e9:.1f} GFLOP/tile, {tflops:.1f} TFLOP/s{mfu}",
                )
                if peak:
                    emit("embed", name, "mfu", round(tflops / peak, 3), "", "ok", f"dense bf16 peak {peak:g}")
                options = _options(name, args, threads, batch, plan.readers)
                tiles = min(plan.embed_tiles, max(tiles, int(fwd * plan.end2end_seconds)))
                n, s = measure_end2end([rt], _first_tiles(slides, tiles), Path(tmp) / name, options, batch)
                e2e = n / s
                emit("embed", name, "end2end", round(e2e, 1), "tiles/s", "ok", f"{n} tiles")
                ratio = e2e / fwd
                verdict = "ok" if ratio >= 0.8 else "below aim"
                emit("embed", name, "end2end/forward", round(ratio, 3), "", verdict, "aim >= 0.8")
                del rt
            except Exception as exc:  # one encoder failing leaves the others measured
                log.exception("embed %s failed", name)
                emit(
                    "embed", name, "end2end", "", "tiles/s", f"failed: {type(exc).__name__}: {exc}"[:200], ""
                )
            if cuda:
                torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ long bags, MIL
def _attention_rows(emit: Emit, section: str, row: dict[str, Any], what: str) -> None:
    name = f"{row['attention']} {row['tokens']:,} tokens"
    if row["status"] == "ok":
        emit(
            section,
            name,
            what,
            round(float(row["fwd_bwd_s"]), 3),
            "s",
            "ok",
            f"peak {float(row['peak_mem_mb']):,.0f} MB, {float(row['kb_per_token']):.1f} KB/token, "
            f"{row['dtype']}",
        )
    elif row["status"] == "skipped":
        emit(section, name, what, "", "s", "skipped", f"estimated {row['est_s']} s, over the point budget")
    else:
        emit(section, name, what, "", "s", f"failed: {row['status']}"[:200], row.get("dtype", ""))


def section_attention(plan: Plan, emit: Emit) -> None:
    """No-grad forward of vit-wsi over a bag streamed in chunks, up to 1,000,000 tokens, each variant;
    sizes estimated above the point budget are skipped (attention_scaling._series)."""
    import attention_scaling as ats

    cuda = plan.device == "cuda"
    args = argparse.Namespace(mode="infer", device=plan.device, bf16=cuda, compile=False, plain=False,
                              threads=min(os.cpu_count() or 1, 16), repeats=1)  # fmt: skip
    dtype = "bf16-autocast" if cuda else "float32"
    for att in plan.infer_variants:
        for row in ats._series(args, "mil", att, list(plan.infer_sizes), plan.point_budget_s, dtype, {}):
            _attention_rows(emit, "attention-1m", row, "forward")


def section_long_train(plan: Plan, emit: Emit) -> None:
    """One forward + backward step of vit-wsi on one bag of plan.long_tokens tiles, with the model's own
    defaults (activation checkpointing above 16,384 tokens), bf16 autocast on CUDA."""
    import attention_scaling as ats

    cuda = plan.device == "cuda"
    for att in plan.long_variants:
        cfg = {"mode": "train", "model": "mil", "attention": att, "tokens": plan.long_tokens,
               "device": plan.device, "bf16": cuda, "compile": False, "plain": False,
               "threads": min(os.cpu_count() or 1, 16), "repeats": 1, "budget_s": 60.0}  # fmt: skip
        row = {**cfg, **ats.run_point(cfg), "dtype": "bf16-autocast" if cuda else "float32"}
        _attention_rows(emit, "train-1m", row, "fwd+bwd")


def section_train_epoch(plan: Plan, emit: Emit) -> None:
    """One epoch of TCGA-NSCLC-like bags (train_throughput: log-normal lengths, median 3,000, max
    11,000, 2048-d) per variant; with fewer than 1,000 bags the epoch is extrapolated per tile."""
    import attention_scaling as ats
    import train_throughput as tt

    full = tt.bag_lengths(1000)
    ranked = sorted(full)
    n = plan.epoch_bags
    lengths = full if n >= 1000 else [ranked[int((i + 0.5) * 1000 / n)] for i in range(n)]
    lengths = [min(k, plan.epoch_max_tiles) for k in lengths]
    for att in plan.epoch_variants:
        cfg = {
            "attention": att,
            "device": plan.device,
            "lengths": lengths,
            "threads": min(os.cpu_count() or 1, 16),
        }
        res = ats.run_in_process(tt._run_variant, cfg, 300)
        name = f"{att}, {len(lengths)} bags"
        if res.get("ok"):
            epoch = res["seconds"] * sum(full) / sum(lengths)
            note = f"{sum(lengths):,} tiles, peak {res['peak_mem_mb']:,.0f} MB" + (
                "" if n >= 1000 else f"; extrapolated from {n} bags"
            )
            status = "ok" if att != "seqnorm" or epoch <= 30 else "below aim"
            emit("train-epoch", name, "s / epoch of 1,000 bags", round(epoch, 2), "s", status, note)
        else:
            emit("train-epoch", name, "s / epoch of 1,000 bags", "", "s",
                 f"failed: {res.get('error') or res.get('status')}"[:200], "")  # fmt: skip


# In run order: embed last, so the seconds the others leave unused go to the longest section.
SECTIONS: dict[str, Callable[..., None]] = {
    "gpu-tests": section_gpu_tests,
    "train-epoch": section_train_epoch,
    "train-1m": section_long_train,
    "attention-1m": section_attention,
    "feed": section_feed,
    "decoders": section_decoders,
    "embed": section_embed,
}
# run only when named (--sections long-1m): minutes of their own
EXTRA_SECTIONS: dict[str, Callable[..., None]] = {"long-1m": section_long}
# share of the suite's budget per section after gpu-tests' fixed seconds (GPU: 330 of 360 s)
SHARES = {"gpu-tests": 0.0, "train-epoch": 0.21, "train-1m": 0.09, "attention-1m": 0.15, "feed": 0.06,
          "decoders": 0.05, "embed": 0.44, "long-1m": 1.0}  # fmt: skip

"""The GPU suite's feed sections (issue 34), beside gpu_sections.py's: each hands rows to `emit`.

  feed      the device-decode feed step by step (benchmarks/embed_feed.py): reading per reader process
            against the plain os.pread loop and the reader before issue 34, pinned copy, to device, decode,
            crop/resize; the stage that bounds the feed; pinned host blocks allocated after warm-up
  decoders  JPEG decoders on the device decoder's batches (benchmarks/jpeg_codecs.py): torchvision,
            nvImageCodec, DALI where installed, their pixels against libjpeg-turbo; cuCIM against openslide
            for the CPU path's reads
  long-1m   end to end through `embed_works` with RetCCL over 1,000,000 tiles in one process (the scenario
            in which device decode crashed); not in the default run: `--sections long-1m`
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

Emit = Any


def section_feed(plan: Any, emit: Emit) -> None:
    import torch

    from embed_feed import READS, time_device_steps, time_reads
    from embed_throughput import _slide_jobs
    from wsi.pipelines.embed.device_decode import RawSlideReader

    device = torch.device(plan.device)
    cuda = device.type == "cuda"
    batch = 256 if cuda else 32
    with tempfile.TemporaryDirectory(prefix="gpu-suite-feed-") as tmp:
        slides, _ = _slide_jobs(Path(tmp), min(plan.slide_mm, 8.0), 1)
        st = dataclasses.replace(slides[0], decode="device")
        reader = RawSlideReader.open(st)
        assert reader is not None, "the generated slide is not a tiled JPEG TIFF"
        spans = [(a, min(a + batch, st.n)) for a in range(0, st.n, batch)]
        reads = time_reads(reader, spans, cuda, 3 if plan.device == "cpu" else 7)
        med = {k: statistics.median(v) for k, v in reads["seconds"].items()}
        for name in READS:
            ratio = statistics.median(
                p / q for p, q in zip(reads["seconds"]["pread"], reads["seconds"][name], strict=True)
            )
            today = name == "read" or name.startswith("read,")
            status = "below aim" if today and ratio < 0.8 else "ok"
            emit("feed", name, "tiles/s per reader", round(st.n / med[name], 1), "tiles/s", status,
                 f"{reads['bytes'] / 1e6 / med[name]:,.0f} MB/s, {ratio:.2f} of pread"
                 + (", pinned" if cuda else ""))  # fmt: skip
        host = torch.cuda.host_memory_stats().get("num_host_alloc", 0) if cuda else 0
        steps = time_device_steps(reader, spans, device)
        reader.close()
        rates = {k: st.n / v for k, v in steps.items() if v}
        for name, rate in rates.items():
            emit("feed", name, "tiles/s", round(rate, 1), "tiles/s", "ok", f"batch {batch}, {device.type}")
        if cuda:
            grown = torch.cuda.host_memory_stats().get("num_host_alloc", 0) - host
            emit("feed", "pinned host blocks", "new after warm-up", grown, "blocks", "ok",
                 "torch's caching host allocator: 0 = every pinned batch reused a block")  # fmt: skip
        readers = plan.readers * st.n / med["read"]
        thread = 1 / sum(1 / r for r in rates.values())
        bound = "readers" if readers < thread else "decode thread (to device + decode + crop/resize)"
        emit("feed", "bound", "tiles/s", round(min(readers, thread), 1), "tiles/s", "ok",
             f"{bound}: readers {readers:,.0f} ({plan.readers} x one), decode thread "
             f"{thread:,.0f}")  # fmt: skip


def section_decoders(plan: Any, emit: Emit) -> None:
    import torch

    from jpeg_codecs import run

    with tempfile.TemporaryDirectory(prefix="gpu-suite-decoders-") as tmp:
        n_read = 200 if plan.device == "cuda" else 16
        rows = run(torch.device(plan.device), min(plan.slide_mm, 4.0), 256, 3, n_read, Path(tmp))
    for r in rows:
        if r["status"] != "ok":
            emit("decoders", f"{r['name']} ({r['what']})", "tiles/s", "", "tiles/s", r["status"], "")
            continue
        detail = f"max mean abs diff {r['max_mean_abs_diff']:.2f} from libjpeg-turbo"
        if "jpeg_per_s" in r:
            detail += f", {r['jpeg_per_s']:,.0f} JPEG tiles/s, {r['mb_per_s']:,.0f} MB/s"
        emit("decoders", f"{r['name']} ({r['what']}, {r['device']})", "tiles/s", round(r["tiles_per_s"], 1),
             "tiles/s", "ok", detail)  # fmt: skip


def section_long(plan: Any, emit: Emit) -> None:
    import argparse

    import torch

    from embed_throughput import _options, _slide_jobs, measure_end2end, random_encoder
    from wsi.pipelines.embed.engine import prepare_runtime

    device = torch.device(plan.device)
    cuda = device.type == "cuda"
    n_tiles, name, batch = (1_000_000, "retccl", 256) if cuda else (64, "timm:test_resnet", 8)
    with tempfile.TemporaryDirectory(prefix="gpu-suite-long-") as tmp:
        slides, _ = _slide_jobs(Path(tmp), plan.slide_mm, n_tiles)
        slides = [dataclasses.replace(s, decode="device") for s in slides]
        extra = sum(s.n for s in slides) - n_tiles
        if extra > 0:
            last = slides[-1]
            slides[-1] = dataclasses.replace(last, coords_px=last.coords_px[: last.n - extra])
        rt = prepare_runtime(random_encoder(name, device), device=device, precision=plan.precision,
                             compile=False, threads=1, batch_size=batch)  # fmt: skip
        args = argparse.Namespace(
            precision=plan.precision, compile=False, reader_mode="process", decode="device"
        )
        options = _options(name, args, 1, batch, plan.readers)
        t0 = time.perf_counter()
        n, seconds = measure_end2end([rt], slides, Path(tmp) / "bags", options, batch)  # raises on a failure
        emit("long-1m", f"{name}, {len(slides)} slide jobs", "end2end", round(n / seconds, 1), "tiles/s",
             "ok" if n == n_tiles else f"failed: {n} of {n_tiles} tiles",
             f"{n:,} tiles in {time.perf_counter() - t0:.0f} s, device decode, one process")  # fmt: skip

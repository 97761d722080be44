"""Embedding throughput per encoder: tiles/s end to end beside reading alone and the forward pass alone.

Three measurements on the same tiles, so the bottleneck is visible (for every encoder of --encoders;
random weights: speed does not depend on their values):
  read      the feed only: read + decode + resize to (B, 256, 256, 3) uint8 batches in --readers
            background processes (pinned memory on CUDA), nothing encoded
  forward   the encoder only, on pre-decoded uint8 tensors already on the device: resize/crop/normalise
            + the network under the stage's runtime (bf16 autocast + fused attention, channels_last for
            CNNs on CUDA, fp32 on CPU); with its FLOPs per tile (counted on the meta device) the achieved
            TFLOP/s and, on a GPU, the model FLOP utilisation (MFU = achieved / the device's dense bf16 peak)
  end2end   `embed_works` (the multi-encoder engine) with this encoder alone, as `wsi embed` runs it:
            read + decode -> device -> preprocess + forward -> NaN check -> HDF5 bags
  one-pass  with --one-pass: every encoder of --encoders in ONE `embed_works` pass (each tile read and
            decoded once, one bag per encoder), as `wsi embed --encoder A --encoder B` runs it; its
            tiles/s counts tiles read, so compare it with 1 / (sum over encoders of 1 / end2end)

Tiles are 256 um at 1 um/px from a generated pyramidal JPEG slide at 0.46 um/px (so every tile is read
from the 0.92 um/px level and resized), the real H&E texture when ../shared/data has it. One slide is
repeated as several slide jobs to reach --tiles; each job writes its own bag.

    python benchmarks/embed_throughput.py --quick                 # CPU smoke run
    python benchmarks/embed_throughput.py --device cpu            # the CPU table in docs/benchmarks.md
    python benchmarks/embed_throughput.py --device cuda --readers 15 --tiles 30000   # one H100
    python benchmarks/embed_throughput.py --device cuda --decode cpu     # openslide decoding, to compare
    python benchmarks/embed_throughput.py --device cpu --encoders all --forward-only --tiles 4
    python benchmarks/embed_throughput.py --device cpu --encoders retccl,ctranspath,uni --tiles 48 \
        --one-pass --out /tmp/bench                  # the multi-encoder path on a CPU (a few minutes)

--decode device (the default on CUDA): readers only slice the compressed JPEG tiles out of the file, the main
process decodes (nvjpeg), assembles and resizes them on the device; "read" then includes decoding.

Writes embed_throughput_<device>.csv into --out (default docs/) and prints a markdown table with the
ratios end2end / forward (what reading, decoding and writing cost beside the network) and the goal check
end2end >= 80% of min(read, forward); aims on one H100 (issue 12): retccl >= 10,000 tiles/s, uni >=
3,000, uni2-h >= 1,000 end to end, and end2end >= 0.8 x forward for every encoder.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from _machine import cpu_model  # benchmarks/_machine.py, beside this script
from wsi.core.files import atomic_path
from wsi.models.encoders import ENCODERS, Encoder, build_encoder, get_recipe
from wsi.models.encoders.encoder import build_backbone
from wsi.pipelines.embed.batches import SlideTiles
from wsi.pipelines.embed.device_decode import DeviceDecoder, decode_ahead
from wsi.pipelines.embed.engine import (
    EmbedOptions,
    Runtime,
    SlideJob,
    SlideWork,
    embed_works,
    encode,
    prepare_runtime,
    resolve_decode,
)
from wsi.pipelines.embed.feed import iter_batches
from wsi.pipelines.scheduling.devices import resolve_device
from wsi.slides.slide import open_slide
from wsi.synthetic import write_sample_slide
from wsi.tiling.grid import make_grid

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("embed_throughput")
TILE_UM, TARGET_MPP, SLIDE_MPP = 256.0, 1.0, 0.46
FIELDS = ("encoder", "measure", "tiles", "seconds", "tiles_per_s", "gflop_per_tile", "tflops", "mfu",
          "device", "device_name", "precision", "batch_size", "readers", "threads", "decode")  # fmt: skip
# dense bf16 peak TFLOP/s by device name (vendor data sheets; sparsity excluded); --peak-tflops overrides
PEAK_BF16_TFLOPS = {
    "H200": 989.4,
    "H100 PCIe": 756.0,
    "H100": 989.4,
    "A100": 312.0,
    "L40S": 362.1,
    "L4": 121.0,
}
AIMS = {"retccl": 10_000, "uni": 3_000, "uni2-h": 1_000}  # end-to-end tiles/s on one H100 (issue 12)
BIG_ON_CPU = 100e9  # FLOPs per tile above which the CPU forward runs a handful of tiles only
VIT_ON_CPU = 20e9  # FLOPs per tile above which the CPU runs a reduced batch (ViT-L and up)


def _slide_jobs(folder: Path, side_mm: float, n_tiles: int) -> tuple[list[SlideTiles], Path]:
    slide = write_sample_slide(
        folder / "bench.svs", size_um=side_mm * 1000, mpp=SLIDE_MPP, texture="auto", seed=0
    )
    grid = make_grid(slide.width_px, slide.height_px, mpp=SLIDE_MPP, tile_um=TILE_UM)
    per_slide = len(grid)
    repeats = max(1, math.ceil(n_tiles / per_slide))
    log.info("slide %s: %d tiles (%s texture), %d passes", slide.path, per_slide, slide.texture, repeats)
    tiles = [
        SlideTiles(
            slide_id=f"bench-{i:04d}",
            slide_path=str(slide.path),
            backend="openslide",
            mpp=SLIDE_MPP,
            tile_um=TILE_UM,
            target_mpp=TARGET_MPP,
            tile_px=round(TILE_UM / TARGET_MPP),
            coords_px=grid.coords,
        )
        for i in range(repeats)
    ]
    return tiles, slide.path


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_read(
    slides: list[SlideTiles], *, batch_size: int, readers: int, pin: bool, mode: str, device: torch.device
) -> tuple[int, float]:
    """The feed alone; with device decode, including decoding and resizing on the device."""
    start = time.perf_counter()
    n = 0
    with DeviceDecoder(device) as decoder:
        batches = iter_batches(slides, batch_size=batch_size, readers=readers, pin_memory=pin, mode=mode)
        for batch in decode_ahead(batches, decoder):  # batches read as pixels pass through unchanged
            n += int(batch.ok.sum())
    _sync(device)
    return n, time.perf_counter() - start


def measure_forward(rt, *, batch_size: int, n_tiles: int) -> tuple[int, float]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch_size, 256, 256, 3), dtype=torch.uint8, generator=g).to(rt.device)
    for _ in range(3 if rt.device.type == "cuda" else 1):  # warm-up: cuDNN autotune, compile
        encode(rt, x)
    _sync(rt.device)
    steps = max(1, n_tiles // batch_size)
    start = time.perf_counter()
    for _ in range(steps):
        encode(rt, x)
    _sync(rt.device)
    return steps * batch_size, time.perf_counter() - start


def measure_end2end(
    runtimes: list[Runtime], slides: list[SlideTiles], out: Path, options: EmbedOptions, batch_size: int
) -> tuple[int, float]:
    """Tiles read per second through the multi-encoder engine: every runtime embeds every slide, one read."""
    sizes = {st.slide_path: open_slide(st.slide_path).dimensions for st in slides}  # bags record it
    works = [
        SlideWork(
            tuple(
                SlideJob(
                    tiles=st,
                    bag_path=out / rt.encoder.encoder_id / f"{st.slide_id}.h5",
                    coords_um=(st.coords_px * SLIDE_MPP).astype(np.float32),
                    tile_params={"benchmark": True},
                    level0_size=sizes[st.slide_path],
                )
                for rt in runtimes
            )
        )
        for st in slides
    ]
    for rt in runtimes:
        (out / rt.encoder.encoder_id).mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results = embed_works(
        runtimes, works, options=options, readers=options.readers, mode=options.reader_mode, progress=False,
        batch_size=batch_size,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    rows = [r for row in results for r in row if r is not None]
    bad = [r for r in rows if r.status != "ok"]
    if bad:
        raise RuntimeError(f"end-to-end run had failures: {bad[:2]}")
    return sum(r.n for r in rows) // len(runtimes), seconds


def flops_per_tile(name: str) -> float:
    """Forward FLOPs of one tile (matmuls, convolutions, attention), counted on the meta device."""
    from torch.utils.flop_counter import FlopCounterMode

    recipe = get_recipe(name)
    with torch.device("meta"):
        enc = Encoder(recipe, build_backbone(recipe), name=name, weights_sha256="-", input_px=recipe.input_px)
        with FlopCounterMode(display=False) as counter:
            enc(torch.empty(1, 3, recipe.input_px, recipe.input_px))
    return float(counter.get_total_flops())


def random_encoder(name: str, device: torch.device) -> Encoder:
    """Random weights without timm's slow initialisation (half a minute for a giant on a CPU)."""
    recipe = get_recipe(name)
    with torch.device("meta"):
        backbone = build_backbone(recipe)
    if any(n not in backbone.state_dict() for n, _ in backbone.named_buffers()):  # derived buffers (Swin)
        return build_encoder(name, random_init=True)
    backbone = backbone.to_empty(device=device)
    with torch.no_grad():
        for pname, param in backbone.named_parameters():
            param.normal_(
                1.0 if pname.endswith(("norm.weight", "norm1.weight", "norm2.weight")) else 0.0, 0.02
            )
        for bname, buf in backbone.named_buffers():
            buf.fill_(1.0 if bname.endswith("running_var") else 0.0)
    return Encoder(recipe, backbone, name=name, weights_sha256="random", input_px=recipe.input_px)


def peak_tflops(device_name: str, override: float | None) -> float | None:
    if override:
        return override
    for key, value in PEAK_BF16_TFLOPS.items():  # longest names first in the table where they overlap
        if key in device_name:
            return value
    return None


def _options(
    name: str, args: argparse.Namespace, threads: int, batch_size: int, readers: int
) -> EmbedOptions:
    return EmbedOptions(
        encoder=name.split("+")[0], random_init=True, precision=args.precision, compile=args.compile,
        threads=threads, batch_size=batch_size, readers=readers, reader_mode=args.reader_mode,
        dtype="float16", decode=args.decode,
    )  # fmt: skip


def _row(name: str, measure: str, n: int, seconds: float, flops: float, peak: float | None, batch_size: int,
         common: dict) -> dict:  # fmt: skip
    rate = n / seconds
    tflops = rate * flops / 1e12 if measure != "read" else None
    return {"encoder": name, "measure": measure, "tiles": n, "seconds": round(seconds, 3),
            "tiles_per_s": round(rate, 3), "gflop_per_tile": round(flops / 1e9, 1),
            "tflops": round(tflops, 2) if tflops is not None else "",
            "mfu": round(tflops / peak, 3) if tflops is not None and peak else "", "batch_size": batch_size,
            **common}  # fmt: skip


def main() -> None:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default=default_device)
    ap.add_argument("--encoders", default="retccl", help="comma-separated names, or all [retccl]")
    ap.add_argument("--forward-only", action="store_true", help="skip read and end2end (encoder speed only)")
    ap.add_argument(
        "--one-pass", action="store_true", help="also run all --encoders in one pass (tiles read once)"
    )
    ap.add_argument("--quick", action="store_true", help="a small run (seconds on CPU)")
    ap.add_argument("--tiles", type=int, default=None, help="tiles per measurement [cpu 192, cuda 20000]")
    ap.add_argument(
        "--slide-mm", type=float, default=None, help="side of the generated slide [cpu 4, cuda 12]"
    )
    ap.add_argument("--readers", type=int, default=None, help="reader processes [cores - 1, at least 1]")
    ap.add_argument("--reader-mode", choices=["process", "thread"], default="process")
    ap.add_argument("--threads", type=int, default=None, help="CPU torch threads [all cores]")
    ap.add_argument(
        "--batch-size", type=int, default=None, help="[cuda 256; cpu 32, 8 for ViT-L and up, 2 for giants]"
    )
    ap.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--compile", action="store_true", help="torch.compile the encoder (CUDA)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="device dense bf16 peak [by device name]")
    ap.add_argument(
        "--decode",
        choices=["auto", "device", "cpu"],
        default="auto",
        help="JPEG decoding on the device or in the CPU readers [auto: device on CUDA]",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("wsi.models.encoders").setLevel(logging.ERROR)  # the random-init warning, on purpose

    cuda = args.device == "cuda"
    cores = os.cpu_count() or 1
    n_tiles = args.tiles or (64 if args.quick else (20000 if cuda else 192))
    side_mm = args.slide_mm or (2.0 if args.quick else (12.0 if cuda else 4.0))
    readers = args.readers if args.readers is not None else max(1, cores - 1)
    threads = args.threads or cores
    device = resolve_device(args.device)
    device_name = torch.cuda.get_device_name(device) if cuda else cpu_model()
    precision = args.precision if cuda else "fp32"
    peak = peak_tflops(device_name, args.peak_tflops) if cuda else None
    names = ENCODERS.names() if args.encoders == "all" else [n.strip() for n in args.encoders.split(",")]
    decode = resolve_decode(args.decode, device)
    rows: list[dict] = []
    common = {"device": args.device, "device_name": device_name, "precision": precision, "readers": readers,
              "threads": threads if not cuda else "", "decode": decode}  # fmt: skip
    kept: list[tuple[Runtime, int]] = []  # encoders kept for --one-pass
    with tempfile.TemporaryDirectory(prefix="embed-bench-") as tmp:
        slides: list[SlideTiles] = []
        if not args.forward_only:
            slides, _ = _slide_jobs(Path(tmp), side_mm, n_tiles)
            extra = sum(st.n for st in slides) - n_tiles  # trim the last pass: every measurement sees n_tiles
            if extra > 0:
                last = slides[-1]
                slides[-1] = dataclasses.replace(last, coords_px=last.coords_px[: max(1, last.n - extra)])
            slides = [dataclasses.replace(st, decode=decode) for st in slides]
        flops_of: dict[str, float] = {}
        for name in names:
            flops = flops_of[name] = flops_per_tile(name)
            giant = not cuda and flops > BIG_ON_CPU
            cpu_batch = 2 if giant else (8 if flops > VIT_ON_CPU else 32)
            batch_size = args.batch_size or (256 if cuda else cpu_batch)
            encoder = random_encoder(name, device if cuda else torch.device("cpu"))
            rt = prepare_runtime(
                encoder, device=device, precision=args.precision, compile=args.compile, threads=threads,
                batch_size=batch_size,
            )  # fmt: skip
            options = _options(name, args, threads, batch_size, readers)
            forward_tiles = min(n_tiles, 2 * batch_size) if giant else n_tiles
            measures: dict[str, Callable[[], tuple[int, float]]] = {
                "forward": partial(measure_forward, rt, batch_size=batch_size, n_tiles=forward_tiles)
            }
            if not args.forward_only:
                measures["read"] = partial(
                    measure_read, slides, batch_size=batch_size, readers=readers, pin=cuda,
                    mode=args.reader_mode, device=device,
                )  # fmt: skip
                measures["end2end"] = partial(
                    measure_end2end, [rt], slides, Path(tmp) / f"bags-{name}", options, batch_size
                )
            for measure, fn in measures.items():
                n, seconds = fn()
                rows.append(_row(name, measure, n, seconds, flops, peak, batch_size, common))
                log.info("%s %s: %d tiles in %.2f s = %.1f tiles/s", name, measure, n, seconds, n / seconds)
            if args.one_pass and not args.forward_only:
                kept.append((rt, batch_size))
            del rt, encoder
            if cuda and not args.one_pass:
                torch.cuda.empty_cache()
        if kept and len(kept) > 1:
            batch = min(b for _, b in kept)  # one feed batch for all, as `wsi embed` does
            runtimes = [dataclasses.replace(rt, pad_to=batch if rt.pad_to else None) for rt, _ in kept]
            label = "+".join(names)
            options = _options(label, args, threads, batch, readers)
            n, seconds = measure_end2end(runtimes, slides, Path(tmp) / "bags-one-pass", options, batch)
            rows.append(_row(label, "one-pass", n, seconds, sum(flops_of.values()), peak, batch, common))
            log.info("%s one-pass: %d tiles in %.2f s = %.1f tiles/s", label, n, seconds, n / seconds)
    _report(rows, args, cuda=cuda, device_name=device_name, cores=cores, readers=readers, threads=threads,
            decode=decode, precision=precision, peak=peak)  # fmt: skip


def _report(rows: list[dict], args: argparse.Namespace, *, cuda: bool, device_name: str, cores: int,
            readers: int, threads: int, decode: str, precision: str, peak: float | None) -> None:  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.decode == "auto" else f"_{args.decode}"
    if args.encoders != "retccl":
        suffix += "_encoders"
    csv_path = args.out / f"embed_throughput_{args.device}{suffix}.csv"
    with atomic_path(csv_path) as tmp_csv, open(tmp_csv, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"\nrandom weights, 256 um tiles at 1 um/px; {device_name}; nproc {cores}; precision {precision}")
    print(
        f"readers {readers} ({args.reader_mode}), decode {decode}" + ("" if cuda else f", threads {threads}")
    )
    if peak:
        print(f"MFU against a dense bf16 peak of {peak:g} TFLOP/s")
    print("\n| encoder | GFLOP/tile | measure | batch | tiles | seconds | tiles/s | TFLOP/s | MFU |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        cells = [r["encoder"], r["gflop_per_tile"], r["measure"], r["batch_size"], r["tiles"],
                 f"{r['seconds']:.2f}", f"{r['tiles_per_s']:.2f}", r["tflops"], r["mfu"]]  # fmt: skip
        print("| " + " | ".join(str(c) for c in cells) + " |")
    separate = 0.0  # seconds per tile of all encoders run one after the other
    for name in dict.fromkeys(r["encoder"] for r in rows):
        rate = {r["measure"]: r["tiles_per_s"] for r in rows if r["encoder"] == name}
        if "one-pass" in rate:
            one = rate["one-pass"]
            print(f"{name}: one pass {one:.2f} tiles/s (every tile read once for all encoders) "
                  f"vs {1 / separate:.2f} tiles/s for separate runs: {one * separate:.2f}x")  # fmt: skip
            continue
        if "end2end" not in rate:
            continue
        separate += 1 / rate["end2end"]
        ratio = rate["end2end"] / min(rate["read"], rate["forward"])
        aim = f"; aim on one H100 >= {AIMS[name]:,}" if cuda and name in AIMS else ""
        verdict = "met" if ratio >= 0.8 else "NOT met"
        e2e = rate["end2end"]
        print(f"{name}: end2end / forward = {e2e / rate['forward']:.2f}; end2end / min(read, forward) = "
              f"{ratio:.2f} (goal >= 0.80: {verdict}); end2end {e2e:.1f} tiles/s{aim}")  # fmt: skip
    print(f"CSV: {csv_path}")


if __name__ == "__main__":
    main()

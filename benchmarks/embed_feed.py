"""Where embedding's time goes: every step of the device-decode feed alone, then together, and the step
that bounds end to end (issue 34).

One generated pyramidal JPEG slide at 0.46 um/px (real H&E texture when ../shared/data has it), 256 um
tiles at 1 um/px, so every tile is read from the 0.92 um/px level and resized. Steps alone:
  pread           the file-read limit: a plain loop of os.pread over the byte ranges the reader needs
                  (the JPEG tiles under each batch, each once per batch), nothing else; a batch's bytes
                  are kept until the batch is read, as a reader must deliver them ("bytes dropped":
                  each dropped at once, so malloc hands back the same cache-hot block every time)
  read (before)   the reader before issue 34 (benchmarks/_feed_legacy.py: an object per tile, a pread
                  and a bytes join per JPEG tile)
  read (7ae3dd4)  RawSlideReader.read of commit 7ae3dd4 (benchmarks/_feed_previous.py: os.preadv with a
                  memoryview per tile, the stream header written tile by tile)
  read            today's RawSlideReader.read: the batch's compressed tiles in a few large reads,
                  completed in place, plus the pinned copy on CUDA (the feed's CPU side per reader)
  to device       the batch's bytes from pinned memory to the device (CUDA only)
  decode          the batch's JPEG streams decoded on --device (torchvision decode_jpeg: nvJPEG on CUDA,
                  libjpeg-turbo on the CPU); other decoders: benchmarks/jpeg_codecs.py
  crop/resize     the windows gathered from the decoded tiles and resized to the tile grid
  normalise       the encoder's preprocess (resize/crop to its input size, normalise)
  forward         the network alone (--encoder, random weights)
  write bag       one slide's features to an HDF5 bag
Together: `feed` (iter_batches with --readers processes + decode-ahead: tiles on the device) and
`end2end` (embed_works, as `wsi embed`). The reads are timed in turns, in a new order each round, in this
one process, so the machine's load hits them alike; the tables give medians.

    python benchmarks/embed_feed.py --quick                        # seconds, CPU
    python benchmarks/embed_feed.py --device cpu --rounds 41 --no-together   # docs/benchmarks.md reads
    python benchmarks/embed_feed.py --device cpu                   # every step, and together
    python benchmarks/embed_feed.py --device cuda --readers 8      # one GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from _feed_legacy import legacy_read
from _feed_previous import read as previous_read
from _machine import cpu_model
from embed_throughput import SLIDE_MPP, _slide_jobs, random_encoder
from wsi.formats.bags import BagProvenance, write_bag
from wsi.pipelines.embed.batches import RawBatch, SlideTiles
from wsi.pipelines.embed.device_decode import DeviceDecoder, RawSlideReader, decode_ahead
from wsi.pipelines.embed.device_decode.tile_bytes import cell_table
from wsi.pipelines.embed.engine import EmbedOptions, SlideJob, SlideWork, embed_works, encode, prepare_runtime
from wsi.pipelines.embed.feed import iter_batches
from wsi.pipelines.scheduling.devices import resolve_device
from wsi.slides.slide import open_slide

log = logging.getLogger("embed_feed")
READS = (
    "pread",
    "pread, bytes dropped",
    "read (before)",
    "read (7ae3dd4)",
    "read",
    "read (before), Aperio tiles",
    "read (7ae3dd4), Aperio tiles",
    "read, Aperio tiles",
)
#: stands in for an Aperio JPEGTables tag (CMU-1's is 289 bytes): SOI, tables, EOI
APERIO_TABLES = b"\xff\xd8" + bytes(285) + b"\xff\xd9"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def byte_ranges(reader: RawSlideReader, spans: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Per batch, the (offset, count) of every JPEG tile the reader reads: each cell once per batch."""
    lv, out = reader.lv, []
    for start, stop in spans:
        _, _, cells = cell_table(reader.plans(start, stop).win, lv)
        flat = cells[:, 1] * lv.n_cols + cells[:, 0]
        keep = (lv.counts[flat] > 2) & (lv.offsets[flat] > 0)
        out.append(list(zip(lv.offsets[flat][keep].tolist(), lv.counts[flat][keep].tolist(), strict=True)))
    return out


def time_reads(reader: RawSlideReader, spans: list[tuple[int, int]], pin: bool, rounds: int) -> dict:
    """Wall and CPU seconds of one pass over all batches, per round, for the pread loop, the reader
    before issue 34, at commit 7ae3dd4 and today's, on this slide's tiles as they are and as abbreviated
    Aperio tiles (a 289-byte JPEGTables header, RGB: the per-tile path)."""
    ranges = byte_ranges(reader, spans)
    fd = reader._fd
    aperio = RawSlideReader.open(reader.st)  # its own file handle
    assert aperio is not None
    aperio.lv = dataclasses.replace(reader.lv, tables=APERIO_TABLES, rgb=True)

    def pread() -> None:  # a batch's bytes kept until the batch is done, as any reader must
        for batch in ranges:
            kept = [os.pread(fd, count, offset) for offset, count in batch]
            del kept

    def pread_dropped() -> None:  # each tile's bytes dropped at once: malloc hands back the same block
        for batch in ranges:
            for offset, count in batch:
                os.pread(fd, count, offset)

    def before(r: RawSlideReader) -> Callable[[], None]:
        def run() -> None:
            for start, stop in spans:
                data = legacy_read(r, start, stop).data
                if pin:
                    data.pin_memory()

        return run

    def today(r: RawSlideReader, read: Callable[[RawSlideReader, int, int], RawBatch] = RawSlideReader.read
              ) -> Callable[[], None]:  # fmt: skip
        def run() -> None:
            for start, stop in spans:
                raw = read(r, start, stop)
                if pin:
                    raw.pin_memory()

        return run

    fns: dict[str, Callable[[], None]] = {
        "pread": pread, "pread, bytes dropped": pread_dropped, "read (before)": before(reader),
        "read (7ae3dd4)": today(reader, previous_read), "read": today(reader),
        "read (before), Aperio tiles": before(aperio),
        "read (7ae3dd4), Aperio tiles": today(aperio, previous_read), "read, Aperio tiles": today(aperio),
    }  # fmt: skip
    for fn in fns.values():  # warm: the file in the page cache, code paths loaded
        fn()
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)  # a new order each round: no read always runs after the same other one
        for name in order:
            fn = fns[name]
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    aperio.close()
    n_bytes = sum(c for batch in ranges for _, c in batch)
    return {"seconds": wall, "cpu": cpu, "bytes": n_bytes, "ranges": sum(len(b) for b in ranges)}


def time_device_steps(reader: RawSlideReader, spans: list[tuple[int, int]], device: torch.device) -> dict:
    """Seconds of to device, decode and crop/resize over all batches (one pass each, after a warm-up)."""
    raws = [reader.read(a, b) for a, b in spans]
    cuda = device.type == "cuda"
    out: dict[str, float | None] = {"to device": None}
    if cuda:
        pinned = [r.pin_memory() for r in raws]
        _sync(device)
        t0 = time.perf_counter()
        for r in pinned:
            r.data.to(device, non_blocking=True)
        _sync(device)
        out["to device"] = time.perf_counter() - t0
    with DeviceDecoder(device) as decoder:
        decoder.decode(raws[0])  # warm-up and the per-slide colour check
        stacks = []
        t0 = time.perf_counter()
        for raw in raws:
            stacks.append(decoder._decode_streams(raw, device))
        _sync(device)
        out["decode"] = time.perf_counter() - t0
        ok = torch.ones(1, dtype=torch.bool)
        t0 = time.perf_counter()
        for raw, (stack, bad) in zip(raws, stacks, strict=True):
            decoder._assemble(raw, stack, bad, ok)
        _sync(device)
        out["crop/resize"] = time.perf_counter() - t0
    return out


def time_encoder(name: str, device: torch.device, batch: int, n_batches: int, tile_px: int) -> dict:
    rt = prepare_runtime(random_encoder(name, device), device=device, precision="bf16", compile=False,
                         threads=os.cpu_count() or 1, batch_size=batch)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, tile_px, tile_px, 3), dtype=torch.uint8, generator=g).to(device)
    enc = rt.encoder
    with torch.inference_mode():
        pre = enc.preprocess(x)
        encode(rt, x)  # warm-up
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(n_batches):
            enc.preprocess(x)
        _sync(device)
        t_pre = time.perf_counter() - t0
        with torch.autocast(device.type, dtype=rt.autocast or torch.float32, enabled=rt.autocast is not None):
            t0 = time.perf_counter()
            for _ in range(n_batches):
                enc.forward(pre)
            _sync(device)
        t_fwd = time.perf_counter() - t0
    return {"rt": rt, "normalise": t_pre, "forward": t_fwd, "dim": int(encode(rt, x[:1]).shape[1])}


def time_write(folder: Path, n: int, dim: int) -> float:
    feats = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    coords = np.zeros((n, 2), np.float32)
    prov = BagProvenance(slide_id="bench", encoder="bench", weights_sha256="-", tile_um=256.0,
                         tile_px=256, mpp=SLIDE_MPP, level0_width=1, level0_height=1,
                         tile_params={"benchmark": True})  # fmt: skip
    t0 = time.perf_counter()
    write_bag(folder / "bench.h5", feats=feats, coords_um=coords, coords_px=coords.astype(np.int64),
              provenance=prov)  # fmt: skip
    return time.perf_counter() - t0


def time_together(slides: list[SlideTiles], rt, args: argparse.Namespace, device: torch.device,
                  folder: Path) -> dict:  # fmt: skip
    n = sum(st.n for st in slides)
    t0 = time.perf_counter()
    got = 0
    with DeviceDecoder(device) as decoder:
        batches = iter_batches(slides, batch_size=args.batch_size, readers=args.readers,
                               pin_memory=device.type == "cuda")  # fmt: skip
        for batch in decode_ahead(batches, decoder):
            got += int(batch.ok.sum())
    _sync(device)
    feed = time.perf_counter() - t0
    if got != n:
        raise RuntimeError(f"feed delivered {got} of {n} tiles")
    with open_slide(slides[0].slide_path) as slide:  # bags record the slide's level-0 size
        size = slide.dimensions
    works = [SlideWork((SlideJob(tiles=st, bag_path=folder / f"{st.slide_id}.h5",
                                 coords_um=(st.coords_px * SLIDE_MPP).astype(np.float32),
                                 tile_params={"benchmark": True}, level0_size=size),))
             for st in slides]  # fmt: skip
    options = EmbedOptions(encoder=rt.encoder.name, random_init=True, batch_size=args.batch_size,
                           readers=args.readers, dtype="float16", decode="device")  # fmt: skip
    t0 = time.perf_counter()
    results = embed_works([rt], works, options=options, readers=args.readers, progress=False,
                          batch_size=args.batch_size)  # fmt: skip
    e2e = time.perf_counter() - t0
    bad = [r for row in results for r in row if r is not None and r.status != "ok"]
    if bad:
        raise RuntimeError(f"end-to-end run failed: {bad[:2]}")
    return {"feed": feed, "end2end": e2e, "tiles": n}


def report(reads: dict, steps: dict, n_read: int, n_enc: int, together: dict | None, args, device_name: str,
           cores: int) -> str:  # fmt: skip
    med = {k: statistics.median(v) for k, v in reads["seconds"].items()}
    mb = reads["bytes"] / 1e6
    lines = [f"{device_name}; nproc {cores}; load average {os.getloadavg()[0]:.1f} at the end; batch "
             f"{args.batch_size}; {n_read} tiles per pass, {reads['ranges']} JPEG tiles read per pass "
             f"({mb:.1f} MB); {args.rounds} rounds in turns, medians; vs pread = pread seconds / these "
             "seconds, wall clock (CPU seconds of this process)", "",
             "| step | where | tiles/s | MB/s | seconds | vs pread |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip

    def vs_pread(name: str, key: str) -> float:
        pairs = zip(reads[key]["pread"], reads[key][name], strict=True)
        return statistics.median(p / q for p, q in pairs)

    for name in READS:
        s = med[name]
        lines.append(f"| {name} | one reader process | {n_read / s:,.0f} | {mb / s:,.0f} | {s:.4f} | "
                     f"{vs_pread(name, 'seconds'):.2f} ({vs_pread(name, 'cpu'):.2f}) |")  # fmt: skip
    rates: dict[str, float] = {"readers": args.readers * n_read / med["read"]}
    for name, (s, n) in steps.items():
        if s is None:
            lines.append(f"| {name} | - | skipped (no CUDA) | | | |")
            continue
        rates[name] = n / s
        lines.append(f"| {name} | {'main process / device' if name != 'write bag' else 'writer thread'} | "
                     f"{n / s:,.0f} | | {s:.4f} | |")  # fmt: skip
    if together:
        for name in ("feed", "end2end"):
            s = together[name]
            rate = together["tiles"] / s
            lines.append(f"| **{name}** | together, {args.readers} readers | {rate:,.0f} | | "
                         f"{s:.3f} | |")  # fmt: skip
    # the stages run concurrently: readers (processes), decode thread, encoder, writer thread
    stage = {"readers": rates["readers"]}
    dev = [rates[k] for k in ("to device", "decode", "crop/resize") if k in rates]
    stage["decode thread (to device + decode + crop/resize)"] = 1 / sum(1 / r for r in dev)
    stage["encoder (normalise + forward)"] = 1 / (1 / rates["normalise"] + 1 / rates["forward"])
    stage["writer"] = rates["write bag"]
    bound = min(stage, key=lambda k: stage[k])
    lines += ["", "Stages (they run at once; the slowest bounds end to end):", ""]
    lines += [f"- {k}: {v:,.0f} tiles/s" + (" **<- bounds**" if k == bound else "") for k, v in stage.items()]
    for suffix in ("", ", Aperio tiles"):
        ratio, cpu_ratio = vs_pread(f"read{suffix}", "seconds"), vs_pread(f"read{suffix}", "cpu")
        before, previous = f"read (before){suffix}", f"read (7ae3dd4){suffix}"
        speedup = med[before] / med[f"read{suffix}"]
        lines += ["", f"read{suffix} / pread = {ratio:.2f}, CPU {cpu_ratio:.2f} (goal >= 0.80: "
                  f"{'met' if min(ratio, cpu_ratio) >= 0.8 else 'NOT met'}); 7ae3dd4 / pread = "
                  f"{vs_pread(previous, 'seconds'):.2f}, CPU {vs_pread(previous, 'cpu'):.2f}; before / "
                  f"pread = {vs_pread(before, 'seconds'):.2f}; today / before = {speedup:.1f}x"]  # fmt: skip
    if together:
        lines.append(f"end2end / bound = {together['tiles'] / together['end2end'] / stage[bound]:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    cuda_default = "cuda" if torch.cuda.is_available() else "cpu"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default=cuda_default)
    ap.add_argument("--encoder", default=None, help="[cuda retccl, cpu retccl, --quick timm:test_resnet]")
    ap.add_argument("--slide-mm", type=float, default=None, help="side of the generated slide [8, quick 3]")
    ap.add_argument("--batch-size", type=int, default=256, help="tiles per batch [256]")
    ap.add_argument("--rounds", type=int, default=None, help="timed passes of each read [7, quick 2]")
    ap.add_argument("--readers", type=int, default=None, help="reader processes together [cores - 1, >= 1]")
    ap.add_argument("--encoder-batches", type=int, default=None, help="batches timed [cuda 20, cpu 1]")
    ap.add_argument("--together", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the feed and end2end together [on]")  # fmt: skip
    ap.add_argument("--together-tiles", type=int, default=None,
                    help="tiles of the feed and end2end runs [cuda 10 slide passes, cpu 96]")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="a small run (seconds, CPU)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("wsi.models.encoders").setLevel(logging.ERROR)
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    cores = os.cpu_count() or 1
    args.readers = args.readers if args.readers is not None else max(1, cores - 1)
    args.rounds = args.rounds or (2 if args.quick else 7)
    name = args.encoder or ("timm:test_resnet" if args.quick else "retccl")
    enc_batches = args.encoder_batches or (20 if cuda else 1)
    with tempfile.TemporaryDirectory(prefix="embed-feed-") as tmp:
        slides, _ = _slide_jobs(Path(tmp), args.slide_mm or (3.0 if args.quick else 8.0), 1)
        st = dataclasses.replace(slides[0], decode="device")
        reader = RawSlideReader.open(st)
        if reader is None:
            raise SystemExit("the generated slide is not a tiled JPEG TIFF")
        spans = [(a, min(a + args.batch_size, st.n)) for a in range(0, st.n, args.batch_size)]
        reads = time_reads(reader, spans, cuda, args.rounds)
        dev = time_device_steps(reader, spans, device)
        reader.close()
        enc_batch = args.batch_size if cuda else 8
        enc = time_encoder(name, device, enc_batch, enc_batches, st.tile_px)
        n_enc = enc_batch * enc_batches
        steps: dict[str, tuple[float | None, int]] = {k: (v, st.n) for k, v in dev.items()}
        steps["normalise"] = (enc["normalise"], n_enc)
        steps["forward"] = (enc["forward"], n_enc)
        steps["write bag"] = (time_write(Path(tmp), st.n, enc["dim"]), st.n)
        together = None
        if args.together:
            n = args.together_tiles or (st.n * 10 if cuda else 96)  # the CPU forward is slow
            passes = [dataclasses.replace(st, slide_id=f"pass-{i}", coords_px=st.coords_px[: n - i * st.n])
                      for i in range(-(-n // st.n))]  # fmt: skip
            together = time_together(passes, enc["rt"], args, device, Path(tmp))
    device_name = torch.cuda.get_device_name(device) if cuda else cpu_model()
    print(report(reads, steps, st.n, n_enc, together, args, device_name, cores))


if __name__ == "__main__":
    main()

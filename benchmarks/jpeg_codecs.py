"""JPEG decoders and slide readers side by side on one slide's batches (issue 34): which decodes the
device decoder's batches fastest with the same pixels, and which reads the CPU path's windows fastest.

Decoders, on the JPEG streams RawSlideReader sends (one batch at a time, on --device):
  torchvision   torchvision.io.decode_jpeg: nvJPEG on CUDA (with the stream-order wait), libjpeg-turbo
                on the CPU; today's default (device_decode/codecs.py)
  nvimgcodec    NVIDIA nvImageCodec's batched decode (nvJPEG hardware engine / CUDA on a GPU,
                libjpeg-turbo on the CPU); where installed (pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg)
  dali          NVIDIA DALI fn.decoders.image (device "mixed" on CUDA, "cpu" on the CPU); where installed
Each row: output tiles/s (the tiles whose JPEG tiles were decoded), JPEG tiles/s, compressed MB/s, and
the largest mean absolute difference of a decoded JPEG tile from torchvision's CPU decode (0-255).

Readers of the CPU path (--decode cpu: windows of the level read and decoded in the reader):
  openslide     Slide.read_level of each tile's window (what read_region_um reads before resizing)
  cucim         cuCIM CuImage.read_region of the same windows (CPU); where installed (pip install cucim-cu13)

    python benchmarks/jpeg_codecs.py --quick            # seconds, CPU
    python benchmarks/jpeg_codecs.py --device cuda      # one GPU (the GPU suite's `decoders` section)
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embed_throughput import _slide_jobs
from wsi.pipelines.embed.batches import SlideTiles
from wsi.pipelines.embed.device_decode import RawSlideReader
from wsi.pipelines.embed.device_decode.codecs import codec_status, get_codec, torchvision_decode
from wsi.slides.slide import open_slide

log = logging.getLogger("jpeg_codecs")
Row = dict[str, Any]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def dali_decoder(device: torch.device, batch: int) -> Callable[[list[torch.Tensor], torch.device], list]:
    """A DALI pipeline fed the streams of one batch per run (ImportError without DALI)."""
    from nvidia.dali import fn, pipeline_def, types

    cuda = device.type == "cuda"

    @pipeline_def(batch_size=batch, num_threads=4, device_id=(device.index or 0) if cuda else None,
                  prefetch_queue_depth=1)  # fmt: skip
    def pipe():  # type: ignore[no-untyped-def]
        jpegs = fn.external_source(name="jpegs", dtype=types.UINT8)
        return fn.decoders.image(jpegs, device="mixed" if cuda else "cpu", output_type=types.RGB,
                                 jpeg_fancy_upsampling=True)  # fmt: skip

    p = pipe()
    p.build()

    def decode(streams: list[torch.Tensor], on: torch.device) -> list:
        p.feed_input("jpegs", [s.numpy() for s in streams])
        (out,) = p.run()
        out = out.as_cpu() if cuda else out
        return [torch.from_numpy(np.array(out.at(i))).permute(2, 0, 1) for i in range(len(streams))]

    return decode


def decoder_rows(slide: SlideTiles, device: torch.device, batch: int, rounds: int) -> list[Row]:
    reader = RawSlideReader.open(slide)
    if reader is None:
        raise RuntimeError("the slide is not a tiled JPEG TIFF")
    spans = [(a, min(a + batch, slide.n)) for a in range(0, slide.n, batch)]
    raws = [reader.read(a, b) for a, b in spans]
    reader.close()
    streams = [[r.stream(j) for j in np.flatnonzero(r.lengths).tolist()] for r in raws]
    n_jpeg, n_bytes = sum(map(len, streams)), sum(int(r.lengths.sum()) for r in raws)
    reference = [torchvision_decode(s, torch.device("cpu")) for s in streams]
    status = codec_status()
    candidates: dict[str, Callable[[], Callable]] = {
        "torchvision": lambda: get_codec("torchvision"),
        "nvimgcodec": lambda: get_codec("nvimgcodec"),
        "dali": lambda: dali_decoder(device, max(map(len, streams))),
    }
    rows = []
    for name, make in candidates.items():
        row: Row = {"what": "decode", "name": name, "device": device.type}
        try:
            decode = make()
            decode(streams[0], device)  # warm-up: handles, kernels, the hardware engine
            _sync(device)
            best = float("inf")
            for _ in range(rounds):
                t0 = time.perf_counter()
                out = [decode(s, device) for s in streams]
                _sync(device)
                best = min(best, time.perf_counter() - t0)
            diff = max(
                float((g.cpu().float() - w.float()).abs().mean()) if g is not None else 255.0
                for o, ref in zip(out, reference, strict=True) for g, w in zip(o, ref, strict=True)
            )  # fmt: skip
            row |= {"tiles_per_s": slide.n / best, "jpeg_per_s": n_jpeg / best,
                    "mb_per_s": n_bytes / 1e6 / best, "max_mean_abs_diff": diff, "status": "ok",
                    "detail": status.get(name, "")}  # fmt: skip
        except Exception as exc:  # not installed, or failing: a row that says why
            log.info("%s: %s", name, exc)
            row |= {"status": f"skipped: {type(exc).__name__}: {exc}"[:160]}
        rows.append(row)
    return rows


def reader_rows(slide: SlideTiles, rounds: int, n_max: int) -> list[Row]:
    """Level windows of the first n_max tiles: openslide's read_level against cuCIM's read_region."""
    reader = RawSlideReader.open(slide)
    assert reader is not None
    n = min(n_max, slide.n)
    plans = reader.plans(0, n)
    level, ds = plans.level, reader.downsamples[plans.level]
    reader.close()
    windows = [tuple(w) for w in plans.win.tolist()]
    rows = []
    with open_slide(slide.slide_path, backend="openslide", mpp=slide.mpp) as s:
        reference = [s.read_level(level, x, y, w, h) for x, y, w, h in windows[:8]]

        def openslide_read() -> list[np.ndarray]:
            return [s.read_level(level, x, y, w, h) for x, y, w, h in windows]

        def cucim_reader() -> Callable[[], list[np.ndarray]]:
            from cucim import CuImage

            img = CuImage(slide.slide_path)

            def read() -> list[np.ndarray]:
                return [
                    np.asarray(img.read_region(location=(round(x * ds), round(y * ds)), size=(w, h),
                                               level=level))[..., :3]
                    for x, y, w, h in windows
                ]

            return read

        for name, make in (("openslide", lambda: openslide_read), ("cucim", cucim_reader)):
            row: Row = {"what": "read windows (CPU path)", "name": name, "device": "cpu"}
            try:
                read = make()
                got = read()  # warm-up
                best = float("inf")
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    read()
                    best = min(best, time.perf_counter() - t0)
                pairs = zip(got, reference, strict=False)  # the first windows
                diff = max(float(np.abs(g.astype(np.float32) - r).mean()) for g, r in pairs)
                row |= {"tiles_per_s": n / best, "max_mean_abs_diff": diff, "status": "ok"}
            except Exception as exc:
                log.info("%s: %s", name, exc)
                row |= {"status": f"skipped: {type(exc).__name__}: {exc}"[:160]}
            rows.append(row)
    return rows


def run(
    device: torch.device, slide_mm: float, batch: int, rounds: int, n_read: int, folder: Path
) -> list[Row]:
    slides, _ = _slide_jobs(folder, slide_mm, 1)
    slide = dataclasses.replace(slides[0], decode="device")
    return decoder_rows(slide, device, batch, rounds) + reader_rows(slide, rounds, n_read)


def table(rows: list[Row]) -> str:
    lines = ["| what | name | device | tiles/s | JPEG tiles/s | MB/s | max mean abs diff | status |",
             "|---|---|---|---:|---:|---:|---:|---|"]  # fmt: skip

    def num(r: Row, k: str, fmt: str = "{:,.0f}") -> str:
        return fmt.format(r[k]) if k in r else ""

    for r in rows:
        lines.append(f"| {r['what']} | {r['name']} | {r['device']} | {num(r, 'tiles_per_s')} | "
                     f"{num(r, 'jpeg_per_s')} | {num(r, 'mb_per_s')} | "
                     f"{num(r, 'max_mean_abs_diff', '{:.2f}')} | "
                     f"{r['status']} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cuda = torch.cuda.is_available()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if cuda else "cpu")
    ap.add_argument("--slide-mm", type=float, default=None, help="side of the generated slide [6, quick 2]")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3, help="timed passes; the best counts [3]")
    ap.add_argument("--read-tiles", type=int, default=None, help="tiles the readers read [200, quick 20]")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="jpeg-codecs-") as tmp:
        rows = run(torch.device(args.device), args.slide_mm or (2.0 if args.quick else 6.0), args.batch_size,
                   args.rounds, args.read_tiles or (20 if args.quick else 200), Path(tmp))  # fmt: skip
    print(table(rows))


if __name__ == "__main__":
    main()

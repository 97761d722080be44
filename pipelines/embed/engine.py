"""Encode a stream of tile batches into per-slide feature bags on one device.

The encoder sees uint8 tiles copied from pinned memory without blocking; the device does the resize and
normalisation. Features stay on the device until a slide is complete (one synchronisation per slide),
and bags are written by a writer thread, so neither the copy back nor HDF5 stalls the next batch.

Public API:
  EmbedOptions                      every option of the embed stage (options.py)
  Runtime, prepare_runtime(encoder, *, device, precision, compile, threads, batch_size) -> Runtime
  encode(runtime, tiles (b,P,P,3) uint8) -> (b, D) float32 on the device
  SlideJob                          one slide: tiles to read, bag path, tile-file facts for provenance
  bag_provenance(job, runtime, options, n_bad) -> BagProvenance   the bag's provenance, all of it
  embed_stream(runtime, jobs, *, options, readers, mode, progress) -> list[JobResult]
  resolve_decode(decode, device) -> "cpu" | "device"   (EmbedOptions.decode "auto": device on CUDA)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from models.encoders import Encoder
from pipelines.embed.batches import SlideTiles
from pipelines.embed.device_decode import DeviceDecoder, decode_ahead
from pipelines.embed.feed import iter_batches
from pipelines.embed.options import EmbedOptions, Precision
from pipelines.jobs import JobResult, describe_error
from wsi.bags import BagProvenance, write_bag

log = logging.getLogger(__name__)

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}

__all__ = [
    "EmbedOptions", "Runtime", "SlideJob", "bag_provenance", "embed_stream", "encode", "prepare_runtime",
    "resolve_decode",
]  # fmt: skip


@dataclass(frozen=True)
class SlideJob:
    """One slide: the tiles to read, the bag to write, and the tile-file facts its provenance records."""

    tiles: SlideTiles
    bag_path: Path
    coords_um: np.ndarray  # (N, 2) float32, from the tile file
    tile_params: dict[str, Any]  # the tile stage's parameters, which made these coordinates
    level0_size: tuple[int, int] = (0, 0)  # the slide's (width, height) at level 0, px
    tile_file: str | None = None  # the tile file the coordinates came from


@dataclass
class Runtime:
    encoder: Encoder
    device: torch.device
    autocast: torch.dtype | None
    fn: Any  # encoder.embed, possibly compiled
    pad_to: int | None  # pad short batches to this size (CUDA / compiled: one shape)


def resolve_decode(decode: str, device: torch.device) -> Literal["cpu", "device"]:
    """Where JPEG tiles are decoded: auto means the device when it is a GPU (other files: the CPU)."""
    if decode == "auto":
        return "device" if device.type == "cuda" else "cpu"
    return "device" if decode == "device" else "cpu"


def prepare_runtime(
    encoder: Encoder,
    *,
    device: torch.device,
    precision: Precision = "bf16",
    compile: bool = False,
    threads: int | None = None,
    batch_size: int = 128,
) -> Runtime:
    """Move the encoder to its device in inference form: channels_last + autocast on CUDA, fp32 on CPU."""
    autocast = _AUTOCAST[precision]
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick its fastest kernels
        encoder = encoder.to(device).to(memory_format=torch.channels_last)
    else:
        if autocast is not None:
            log.info("precision %s applies to CUDA; the CPU runs fp32", precision)
        autocast = None
        if threads:
            torch.set_num_threads(threads)
        encoder = encoder.to(device)
    encoder.eval()
    fn = encoder.embed
    if compile:
        fn = torch.compile(encoder.embed, dynamic=False)
    # One batch shape on CUDA: a slide's short last batch would otherwise make cuDNN re-tune (and a
    # compiled graph re-compile) for every new size; padding costs under half a batch per slide.
    pad_to = batch_size if (compile or device.type == "cuda") else None
    return Runtime(encoder, device, autocast, fn, pad_to)


@torch.inference_mode()
def encode(rt: Runtime, tiles: torch.Tensor) -> torch.Tensor:
    """(b, P, P, 3) uint8 -> (b, D) float32 features on the runtime's device (no synchronisation)."""
    x = tiles.to(rt.device, non_blocking=True)
    b = x.shape[0]
    if rt.pad_to and b < rt.pad_to:
        x = torch.cat([x, x.new_zeros((rt.pad_to - b, *x.shape[1:]))])  # (pad_to, P, P, 3)
    with torch.autocast(rt.device.type, dtype=rt.autocast or torch.float32, enabled=rt.autocast is not None):
        feats = rt.fn(x)  # (b', D)
    return feats[:b].float()


@dataclass
class _Acc:
    """Features of one slide as its batches arrive."""

    feats: list[torch.Tensor] = field(default_factory=list)
    ok: list[torch.Tensor] = field(default_factory=list)
    error: str = ""
    start: float = 0.0  # when its first batch arrived (the slides before it are not its time)
    done: int = 0


def bag_provenance(job: SlideJob, rt: Runtime, options: EmbedOptions, n_bad: int) -> BagProvenance:
    """How this slide's bag was made: the tile file's facts, the encoder's and this run's, in one place."""
    st, enc = job.tiles, rt.encoder
    return BagProvenance(
        slide_id=st.slide_id,
        encoder=enc.name,
        weights_sha256=enc.weights_sha256,
        tile_size_um=st.tile_size_um,
        tile_size_px=st.tile_px,
        mpp=st.mpp,
        level0_width=job.level0_size[0],
        level0_height=job.level0_size[1],
        tile_params=job.tile_params,
        target_mpp=st.target_mpp,
        encoder_id=enc.encoder_id,
        input_px=enc.input_px,
        precision="fp32" if rt.autocast is None else options.precision,
        n_tiles_requested=st.n,
        n_bad_tiles=n_bad,
        pixel_source="tile-cache" if st.pixels_path else "slide",
        slide_path=st.slide_path,
        tile_file=job.tile_file,
    )


def _finish(job: SlideJob, acc: _Acc, rt: Runtime, options: EmbedOptions) -> dict[str, Any]:
    """Check a finished slide and return write_bag's arguments; raises a message for a failed slide."""
    if acc.error:
        raise _SlideFailed(acc.error)
    n = job.tiles.n
    ok = torch.cat(acc.ok).numpy()
    n_bad = int((~ok).sum())
    if n_bad > options.max_bad_tiles * n:
        raise _SlideFailed(
            f"{n_bad} of {n} tiles could not be read or decoded, more than --max-bad-tiles "
            f"{options.max_bad_tiles:g}; see the log for the tiles and reasons"
        )
    feats = torch.cat(acc.feats)[torch.from_numpy(ok).to(rt.device)]  # (n_ok, D)
    finite = torch.isfinite(feats).all(dim=1)
    n_bad_feats = int((~finite).sum())  # one synchronisation per slide
    if n_bad_feats:
        raise _SlideFailed(
            f"the encoder produced NaN or infinite features for {n_bad_feats} of {len(feats)} tiles "
            "(weights broken, or --precision fp16 overflowing: try --precision bf16 or fp32)"
        )
    return {
        "feats": feats.cpu().numpy(),
        "coords_um": job.coords_um[ok],
        "coords_px": job.tiles.coords_px[ok],
        "provenance": bag_provenance(job, rt, options, n_bad),
        "dtype": options.dtype,
    }


class _SlideFailed(Exception):
    pass


def embed_stream(
    rt: Runtime,
    jobs: list[SlideJob],
    *,
    options: EmbedOptions,
    readers: int,
    mode: Literal["process", "thread"] = "process",
    progress: bool = True,
) -> list[JobResult]:
    """Embed every job's tiles in one stream and write the bags; one JobResult per job, in order."""
    results: list[JobResult | None] = [None] * len(jobs)
    for i, job in enumerate(jobs):
        if job.tiles.n == 0:
            results[i] = _failed(job, "the tile stage kept no tiles for this slide; nothing to embed", 0.0)
    accs = {i: _Acc() for i, job in enumerate(jobs) if job.tiles.n}
    writes: list[tuple[int, Future[float], float, int]] = []
    total = sum(job.tiles.n for job in jobs)
    decode = resolve_decode(options.decode, rt.device)
    decoder = DeviceDecoder(rt.device) if decode == "device" else None
    batches = iter_batches(
        [dataclasses.replace(job.tiles, decode=decode) for job in jobs],
        batch_size=options.batch_size,
        readers=readers,
        pin_memory=rt.device.type == "cuda",
        mode=mode,
    )
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="wsi-embed-writer") as writer,
        tqdm(total=total, desc="embed", unit="tile", dynamic_ncols=True, disable=not progress) as bar,
        contextlib.closing(decoder) if decoder is not None else contextlib.nullcontext(),
    ):
        if decoder is not None:  # raw JPEG tiles -> (b, P, P, 3) uint8 on the device, a batch ahead
            batches = decode_ahead(batches, decoder)
        for batch in batches:
            i = batch.slide_index
            acc, job = accs[i], jobs[i]
            b = int(batch.tiles.shape[0])
            acc.start = acc.start or time.perf_counter()
            if batch.error:
                acc.error = batch.error
            elif not acc.error:
                try:
                    acc.feats.append(encode(rt, batch.tiles))
                    acc.ok.append(batch.ok)
                except Exception as exc:  # e.g. CUDA out of memory: this slide fails, the stream goes on
                    log.debug("%s: encoding failed", job.tiles.slide_id, exc_info=True)
                    acc.error = f"encoding failed: {describe_error(exc)}"
                    acc.feats.clear()
            acc.done += b
            bar.update(b)
            if acc.done < job.tiles.n:
                continue
            try:
                kwargs = _finish(job, acc, rt, options)
            except _SlideFailed as exc:
                results[i] = _failed(job, str(exc), time.perf_counter() - acc.start)
            except Exception as exc:  # a failure in one slide never stops the others
                log.debug("%s failed", job.tiles.slide_id, exc_info=True)
                results[i] = _failed(job, describe_error(exc), time.perf_counter() - acc.start)
            else:
                n_ok = len(kwargs["feats"])
                writes.append((i, writer.submit(_write, job.bag_path, kwargs), acc.start, n_ok))
            del accs[i]
        for i, future, start, n_ok in writes:
            job = jobs[i]
            try:
                finished = future.result()
                results[i] = JobResult(
                    job.tiles.slide_id, job.tiles.slide_path, "ok", n=n_ok, seconds=finished - start
                )
            except Exception as exc:
                results[i] = _failed(job, describe_error(exc), time.perf_counter() - start)
    return [r for r in results if r is not None]


def _write(path: Path, kwargs: dict[str, Any]) -> float:
    write_bag(path, **kwargs)
    return time.perf_counter()


def _failed(job: SlideJob, error: str, seconds: float) -> JobResult:
    log.error("%s failed: %s", job.tiles.slide_id, error)
    return JobResult(job.tiles.slide_id, job.tiles.slide_path, "failed", seconds=seconds, error=error)

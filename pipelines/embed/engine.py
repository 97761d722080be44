"""Encode a stream of tile batches into per-slide feature bags, for one or several encoders, on one device.

Each batch is read and decoded once; on the device it is stain-normalised (opt-in) and handed, as the
same uint8 tensor, to every encoder that still needs this slide, each with its own preprocessing
(`Encoder.preprocess`). Features stay on the device until a slide is complete (one synchronisation
per slide), and a writer thread writes the bags, so neither the copy back nor HDF5 stalls the next
batch. A failure fails that slide's bag(s), never the stream: a slide that cannot be read fails every
encoder's bag, an encoder that fails on a slide only its own. A `SlideWork` is one slide read once
(`jobs[k]`: encoder k's `SlideJob`, or None); `embed_works` returns one result per work and encoder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

import torch

from wsi.core.progress import progress as progress_bar
from wsi.formats.bags import write_bag
from wsi.models.encoders.stain import StainNormalizer, StainReference
from wsi.pipelines.embed.batches import TileBatch
from wsi.pipelines.embed.config import CPU_BATCH, EmbedOptions
from wsi.pipelines.embed.device_decode import DeviceDecoder, decode_ahead
from wsi.pipelines.embed.feed import iter_batches
from wsi.pipelines.embed.runtime import Runtime, encode, prepare_runtime, prepare_runtimes, resolve_decode
from wsi.pipelines.embed.work import BagWrite, SlideJob, SlideWork, WorkResult, bag_provenance, replaced_since
from wsi.pipelines.scheduling.jobs import describe_error
from wsi.pipelines.scheduling.results import JobResult

log = logging.getLogger(__name__)

__all__ = [
    "EmbedOptions", "Runtime", "SlideJob", "SlideWork", "WorkResult", "bag_provenance", "embed_stream",
    "embed_works", "encode", "prepare_runtime", "prepare_runtimes", "resolve_decode",
]  # fmt: skip


@dataclass
class _Acc:
    """One slide's features (per encoder) as its batches arrive."""

    feats: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # runtime -> (b, D) per batch
    ok: list[torch.Tensor] = field(default_factory=list)  # (b,) bool per batch: the tile was read
    fitted: list[torch.Tensor] = field(default_factory=list)  # (b,) bool on the device: stain fit held
    error: str = ""  # the slide failed for every encoder (unreadable, stain normalisation failed)
    errors: dict[int, str] = field(default_factory=dict)  # runtime -> why its bag failed
    start: float = 0.0  # when its first batch arrived (the slides before it are not its time)
    done: int = 0
    fallback: int | None = None  # readable tiles the stain fit fell back on, counted once


class _SlideFailed(Exception):
    pass


def _take_batch(
    acc: _Acc, work: SlideWork, runtimes: Sequence[Runtime], batch: TileBatch, norm: StainNormalizer | None
) -> int:
    """Add a batch to its slide's accumulator (encoded, or the slide's read error kept); its tiles."""
    acc.start = acc.start or time.perf_counter()
    if batch.error:
        acc.error = batch.error
    elif not acc.error:
        _encode_batch(acc, work, runtimes, batch, norm)
    b = int(batch.tiles.shape[0])
    acc.done += b
    return b


def _encode_batch(
    acc: _Acc, work: SlideWork, runtimes: Sequence[Runtime], batch: TileBatch, norm: StainNormalizer | None
) -> None:
    """Stain-normalise a batch once on the device (opt-in), then run every encoder this slide needs."""
    x = batch.tiles.to(runtimes[0].device, non_blocking=True)  # (b, P, P, 3) uint8, shared by all
    if norm is not None:
        try:
            with torch.inference_mode():
                x, fitted = norm.apply(x)
            acc.fitted.append(fitted)
        except Exception as exc:
            log.debug("%s: stain normalisation failed", work.tiles.slide_id, exc_info=True)
            acc.error = f"stain normalisation failed: {describe_error(exc)}"
            return
    acc.ok.append(batch.ok)
    for k, job in enumerate(work.jobs):
        if job is None or k in acc.errors:
            continue
        try:
            acc.feats.setdefault(k, []).append(encode(runtimes[k], x))
        except Exception as exc:  # e.g. CUDA out of memory: this bag fails, the stream goes on
            log.debug("%s: encoding failed", job.tiles.slide_id, exc_info=True)
            acc.errors[k] = f"encoding failed: {describe_error(exc)}"
            acc.feats.pop(k, None)


def _finish(
    job: SlideJob, acc: _Acc, k: int, rt: Runtime, options: EmbedOptions, stain: StainReference | None
) -> BagWrite:
    """Check encoder k's finished slide and return write_bag's arguments; raises for a failed bag."""
    error = acc.error or acc.errors.get(k, "")
    if error:
        raise _SlideFailed(error)
    n = job.tiles.n
    ok = torch.cat(acc.ok).numpy()
    n_bad = int((~ok).sum())
    if n_bad > options.max_bad_tiles * n:
        raise _SlideFailed(
            f"{n_bad} of {n} tiles could not be read or decoded, more than --max-bad-tiles "
            f"{options.max_bad_tiles:g}; see the log for the tiles and reasons"
        )
    keep = torch.from_numpy(ok).to(rt.device)
    feats = torch.cat(acc.feats[k])[keep]  # (n_ok, D)
    finite = torch.isfinite(feats).all(dim=1)
    n_bad_feats = int((~finite).sum())  # one synchronisation per slide
    if n_bad_feats:
        raise _SlideFailed(
            f"the encoder produced NaN or infinite features for {n_bad_feats} of {len(feats)} tiles "
            "(weights broken, or --precision fp16 overflowing: try --precision bf16 or fp32)"
        )
    if stain is not None and acc.fallback is None:
        fitted = torch.cat(acc.fitted).cpu().numpy()
        acc.fallback = int((~fitted & ok).sum())
        if acc.fallback:
            log.info("%s: stain normalisation left %d of %d tiles as they were (no stable fit: background, "
                     "pen, one colour)", job.tiles.slide_id, acc.fallback, n - n_bad)  # fmt: skip
    return {
        "feats": feats.cpu().numpy(),
        "coords_um": job.coords_um[ok],
        "coords_px": job.tiles.coords_px[ok],
        "provenance": bag_provenance(job, rt, options, n_bad, stain=stain, stain_fallback=acc.fallback),
        "dtype": options.dtype,
    }


def _feed_batch(options: EmbedOptions, runtimes: Sequence[Runtime], batch_size: int | None) -> int:
    if batch_size is not None:
        return batch_size
    if options.batch_size != "auto":
        return options.batch_size
    return runtimes[0].pad_to or CPU_BATCH


def embed_works(
    runtimes: Sequence[Runtime],
    works: Sequence[SlideWork],
    *,
    options: EmbedOptions,
    readers: int,
    mode: Literal["process", "thread"] = "process",
    progress: bool = True,
    stain: StainReference | None = None,
    batch_size: int | None = None,
    publish: Callable[[Path], None] | None = None,
) -> list[list[JobResult | None]]:
    """Read every slide once, embed it with the encoders its jobs name and write the bags.

    Returns, per work, one JobResult per runtime (None where the work has no job for it), in order.
    `publish(path)` runs in the writer thread after each bag is written (a remote --out uploads it);
    a failure there fails that bag.
    """
    results = _empty_rows(works, len(runtimes))
    accs = {i: _Acc() for i, work in enumerate(works) if work.tiles.n}
    writes: list[tuple[int, _Queued]] = []  # (work index, its bag queued for writing)
    norm = StainNormalizer(stain) if stain is not None else None
    batches, decoder = _read_batches(works, runtimes, options, readers, mode, batch_size)
    total = sum(work.tiles.n for work in works)
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="wsi-embed-writer") as writer,
        progress_bar(total=total, desc="embed", unit="tile", disable=not progress) as bar,
        contextlib.closing(decoder) if decoder is not None else contextlib.nullcontext(),
    ):

        def submit(path: Path, kwargs: BagWrite) -> Future[float]:
            return writer.submit(_write, path, kwargs, publish)

        if decoder is not None:  # raw JPEG tiles -> (b, P, P, 3) uint8 on the device, a batch ahead
            batches = decode_ahead(batches, decoder)
        interrupted = False
        try:
            for batch in batches:
                i = batch.slide_index
                acc, work = accs[i], works[i]
                bar.update(_take_batch(acc, work, runtimes, batch, norm))
                if acc.done < work.tiles.n:
                    continue
                # the file read is the file planned; a replaced file is named as the cause first (its
                # tiles then fail to decode, which alone would not say why)
                acc.error = replaced_since(work) or acc.error
                failed, queued = _close_slide(work, accs.pop(i), runtimes, options, stain, submit)
                for k, row in failed.items():
                    results[i][k] = row
                writes += [(i, q) for q in queued]
        except KeyboardInterrupt:  # Ctrl-C: the bags already queued are written (whole), then stop
            interrupted = True
            with contextlib.suppress(Exception):
                getattr(batches, "close", lambda: None)()  # the readers stop
        for i, q in writes:
            results[i][q.encoder] = _written(q)
    if interrupted:
        raise EmbedInterrupted(results)
    return results


def _read_batches(
    works: Sequence[SlideWork], runtimes: Sequence[Runtime], options: EmbedOptions, readers: int,
    mode: Literal["process", "thread"], batch_size: int | None,
) -> tuple[Iterator[TileBatch], DeviceDecoder | None]:  # fmt: skip
    """Every work's tiles read once, in the encoders' batch size, decoded by the readers or (with the
    decoder returned) on the device; CUDA batches in pinned memory for the copy."""
    device = runtimes[0].device
    decode = resolve_decode(options.decode, device)
    decoder = DeviceDecoder(device) if decode == "device" else None
    batches = iter_batches(
        [dataclasses.replace(work.tiles, decode=decode) for work in works],
        batch_size=_feed_batch(options, runtimes, batch_size),
        readers=readers,
        pin_memory=device.type == "cuda",
        mode=mode,
    )
    return batches, decoder


def _empty_rows(works: Sequence[SlideWork], n_runtimes: int) -> list[list[JobResult | None]]:
    """A row per work and runtime: `empty` for a tile file that kept no tile, None until a bag is done."""
    results: list[list[JobResult | None]] = [[None] * n_runtimes for _ in works]
    for i, work in enumerate(works):
        if work.tiles.n == 0:
            for k, job in enumerate(work.jobs):
                if job is not None:
                    results[i][k] = _empty(job)
    return results


class _Queued(NamedTuple):
    """A bag handed to the writer thread (`start`: when its slide's first batch arrived)."""

    encoder: int
    job: SlideJob
    future: Future[float]
    start: float
    n_ok: int


def _close_slide(
    work: SlideWork,
    acc: _Acc,
    runtimes: Sequence[Runtime],
    options: EmbedOptions,
    stain: StainReference | None,
    submit: Callable[[Path, BagWrite], Future[float]],
) -> tuple[dict[int, JobResult], list[_Queued]]:
    """A slide's last batch is in: each encoder's bag checked and queued for writing, or failed
    ({encoder: failed row}, the bags queued)."""
    failed: dict[int, JobResult] = {}
    queued: list[_Queued] = []
    for k, job in enumerate(work.jobs):
        if job is None:
            continue
        try:
            kwargs = _finish(job, acc, k, runtimes[k], options, stain)
        except _SlideFailed as exc:
            failed[k] = _failed(job, str(exc), time.perf_counter() - acc.start)
        except Exception as exc:  # a failure in one slide never stops the others
            log.debug("%s failed", job.tiles.slide_id, exc_info=True)
            failed[k] = _failed(job, describe_error(exc), time.perf_counter() - acc.start)
        else:
            n_ok = len(kwargs["feats"])
            queued.append(_Queued(k, job, submit(job.bag_path, kwargs), acc.start, n_ok))
    return failed, queued


def _written(q: _Queued) -> JobResult:
    """The row of a queued bag once the writer is done with it: ok, or failed with the writer's error."""
    try:
        finished = q.future.result()
        tiles = q.job.tiles
        return JobResult(tiles.slide_id, tiles.slide_path, "ok", n=q.n_ok, seconds=finished - q.start)
    except Exception as exc:
        return _failed(q.job, describe_error(exc), time.perf_counter() - q.start)


class EmbedInterrupted(KeyboardInterrupt):
    """Ctrl-C while embedding: `finished[work][encoder]`, the rows of the bags that were written (None
    for the others), for the manifests."""

    def __init__(self, finished: list[list[JobResult | None]]) -> None:
        super().__init__()
        self.finished = finished


def embed_stream(
    rt: Runtime,
    jobs: list[SlideJob],
    *,
    options: EmbedOptions,
    readers: int,
    mode: Literal["process", "thread"] = "process",
    progress: bool = True,
) -> list[JobResult]:
    """One encoder: embed every job's tiles in one stream and write the bags; one JobResult per job."""
    done = embed_works(
        [rt], [SlideWork((job,)) for job in jobs], options=options, readers=readers, mode=mode,
        progress=progress,
    )  # fmt: skip
    return [row[0] for row in done if row[0] is not None]


def _write(path: Path, kwargs: BagWrite, publish: Callable[[Path], None] | None = None) -> float:
    write_bag(path, **kwargs)
    if publish is not None:
        publish(path)
    return time.perf_counter()


def _failed(job: SlideJob, error: str, seconds: float) -> JobResult:
    log.error("%s failed: %s", job.tiles.slide_id, error)
    return JobResult(job.tiles.slide_id, job.tiles.slide_path, "failed", seconds=seconds, error=error)


def _empty(job: SlideJob) -> JobResult:
    why = "tiling kept no tile: the tile file holds none; nothing to embed"
    log.warning("%s: %s", job.tiles.slide_id, why)
    return JobResult(job.tiles.slide_id, job.tiles.slide_path, "empty", error=why)

"""The tile stage: slides -> tissue mask -> physical grid -> filtered tiles -> tile files + QC images.

Public API:

    TileJob(out_dir, params, backend="openslide", fallback_mpp=None, save_tiles=False,
            overwrite=False, threads=1)                 # picklable per-slide settings
    tile_slides(sources, *, out_dir, params=None, backend="openslide", mpp=None, workers=1,
                scheduler=None, overwrite=False, save_tiles=False, threads=None) -> list[JobResult]
    tile_slide(source, job) -> JobResult                # one slide (what each batch job runs)
    output_paths(out_dir, slide_id) -> TileOutputs      # .h5, .zarr, qc .png of one slide
    read_tile_chunks(slide, coords, params, threads) -> Iterator[(k,P,P,3) uint8]   # reads only
    default_threads(workers) -> int                     # reader threads per slide

Per slide (`_tile_open_slide`): find the tissue and the candidate grid cells (`wsi.tiling.find_tissue`),
read and filter every candidate, write the QC image, then the tile file. Every file is written
atomically and the tile file (.h5) last, so a complete tile file means the slide is done. Each
candidate tile is read once with `Slide.read_region_um`; the same pixels feed the filters and the
optional zarr cache; each chunk of 16 tiles is read and filtered on a pool thread.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

import wsi
from pipelines.jobs import JobResult, run_jobs, write_manifest
from wsi.errors import MissingMppError, SlideError
from wsi.qc import render_qc, save_png
from wsi.slide import Slide, open_slide
from wsi.sources import SlideSource
from wsi.tilefile import TilePixelWriter, is_complete, pixels_complete, read_tile_file, write_tile_file
from wsi.tiling import (
    BACKGROUND,
    BLURRY,
    KEPT,
    UNREADABLE,
    TileCounts,
    TileParams,
    TissueGrid,
    classify_tiles,
    find_tissue,
)

log = logging.getLogger(__name__)

R = TypeVar("R")

#: tiles read and filtered as one job; enough to vectorise the filters, few enough to spread over threads
_CHUNK = 16


@dataclass(frozen=True)
class TileOutputs:
    h5: Path
    zarr: Path
    qc: Path


def output_paths(out_dir: str | os.PathLike[str], slide_id: str) -> TileOutputs:
    out = Path(out_dir)
    return TileOutputs(
        out / "tiles" / f"{slide_id}.h5", out / "tiles" / f"{slide_id}.zarr", out / "qc" / f"{slide_id}.png"
    )


@dataclass(frozen=True)
class TileJob:
    """Settings shared by every slide of a run (sent to each worker with the slide)."""

    out_dir: Path
    params: TileParams = field(default_factory=TileParams)
    backend: str = "openslide"
    #: level-0 um/px for slides whose metadata has none (a record's own `mpp` wins)
    fallback_mpp: float | None = None
    save_tiles: bool = False
    overwrite: bool = False
    #: reader threads per slide
    threads: int = 1


def default_threads(workers: int) -> int:
    """Reader threads per slide: the cores left to each worker process, at most 4."""
    return max(1, min(4, (os.cpu_count() or 1) // max(1, workers)))


def tile_slides(
    sources: Sequence[SlideSource],
    *,
    out_dir: str | os.PathLike[str],
    params: TileParams | None = None,
    backend: str = "openslide",
    mpp: float | None = None,
    workers: int = 1,
    scheduler: str | None = None,
    overwrite: bool = False,
    save_tiles: bool = False,
    threads: int | None = None,
) -> list[JobResult]:
    """Tile every slide; write `out_dir/tiles/manifest.csv`; return one JobResult per slide.

    mpp: level-0 um/px used for slides whose metadata has none (a CSV `mpp` column wins per slide).
    """
    job = TileJob(
        out_dir=Path(out_dir).absolute(),
        params=params or TileParams(),
        backend=backend,
        fallback_mpp=mpp,
        save_tiles=save_tiles,
        overwrite=overwrite,
        threads=threads or default_threads(workers if scheduler is None else 1),
    )
    results = run_jobs(
        sources, functools.partial(tile_slide, job=job), workers=workers, scheduler=scheduler, desc="tile"
    )
    write_manifest(job.out_dir / "tiles" / "manifest.csv", results)
    return results


def tile_slide(source: SlideSource, job: TileJob) -> JobResult:
    """Tile one slide, or skip it when its complete output was made with the same settings."""
    paths = output_paths(job.out_dir, source.slide_id)
    done = _finished_kept(source, job, paths)
    if done is not None:
        return JobResult(source.slide_id, str(source.path), "skipped", n=done)
    slide, mpp_source = _open(source, job)  # a slide that cannot be opened leaves old output alone
    with slide:
        # Drop the old tile file first: from here on only a new, complete one may say "done".
        paths.h5.unlink(missing_ok=True)
        if not job.save_tiles and paths.zarr.exists():
            shutil.rmtree(paths.zarr, ignore_errors=True)  # made with other settings; would not match
        counts = _tile_open_slide(slide, source, job, paths, mpp_source)
    return JobResult(source.slide_id, str(source.path), "ok", n=counts.n_kept)


def _open(source: SlideSource, job: TileJob) -> tuple[Slide, str]:
    """The open slide and where its mpp came from ("slide list", "metadata" or "--mpp")."""
    backend = job.backend
    if source.mpp is not None:
        return open_slide(source.path, backend=backend, mpp=source.mpp), "slide list"
    try:
        return open_slide(source.path, backend=backend), "metadata"
    except MissingMppError:
        if job.fallback_mpp is None:
            raise
        return open_slide(source.path, backend=backend, mpp=job.fallback_mpp), "--mpp"


def _finished_kept(source: SlideSource, job: TileJob, paths: TileOutputs) -> int | None:
    """Kept-tile count of a complete, valid output made with these settings; None to (re)compute."""
    if job.overwrite or not is_complete(paths.h5):
        return None
    meta = read_tile_file(paths.h5)
    reason = None
    if meta.params != job.params.to_dict():  # the stored JSON, decoded; files of any version compare
        reason = "tile settings changed"
    elif meta.meta.get("slide_path") != str(source.path):
        reason = f"slide path changed (was {meta.meta.get('slide_path')})"
    elif source.mpp is not None and abs(meta.mpp - source.mpp) > 1e-9:
        reason = "mpp changed"
    elif source.mpp is None and meta.meta.get("mpp_source") == "slide list":
        reason = f"the slide list no longer gives an mpp (was {meta.mpp:g})"
    elif meta.meta.get("mpp_source") == "--mpp" and job.fallback_mpp != meta.mpp:
        reason = f"--mpp changed (was {meta.mpp:g}, now {job.fallback_mpp})"
    elif job.save_tiles and not pixels_complete(paths.zarr, n=len(meta)):
        reason = "tile pixels (--save-tiles) missing or incomplete"
    elif not paths.qc.is_file():
        reason = "QC image missing"
    if reason:
        log.info("%s: recomputing (%s)", source.slide_id, reason)
        return None
    return len(meta)


def read_tile_chunks(
    slide: Slide, coords: np.ndarray, params: TileParams, threads: int
) -> Iterator[np.ndarray]:
    """(k, P, P, 3) uint8 chunks of the tiles at `coords`, in order, read on `threads` threads."""

    def whole(tiles: np.ndarray, bad: np.ndarray) -> np.ndarray:
        if bad.any():
            raise SlideError(f"{slide.path}: {int(bad.sum())} tile(s) could not be read")
        return tiles

    return _map_chunks(slide, coords, params, threads, whole)


def _classified_chunks(
    slide: Slide, coords: np.ndarray, params: TileParams, threads: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(tiles (k, P, P, 3) uint8, reasons (k,) int8) per chunk of `coords`, in order."""

    def classify(tiles: np.ndarray, bad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        reasons = classify_tiles(tiles, params)
        reasons[bad] = UNREADABLE
        return tiles, reasons

    return _map_chunks(slide, coords, params, threads, classify)


def _map_chunks(
    slide: Slide,
    coords: np.ndarray,
    params: TileParams,
    threads: int,
    then: Callable[[np.ndarray, np.ndarray], R],
) -> Iterator[R]:
    """`then(tiles, unreadable)` per chunk of `coords`, in order.

    Each chunk is read AND passed to `then` (the filters) by one pool thread, so the filters run in
    parallel with reads of other chunks (a main thread filtering while the pool reads overlapped
    poorly, measured); at most 2 x threads chunks are in flight, which bounds memory.
    """

    def work(start: int) -> R:
        return then(*_read_chunk(slide, coords[start : start + _CHUNK], params))

    starts = range(0, len(coords), _CHUNK)
    if threads <= 1:
        yield from map(work, starts)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="tile-read") as pool:
        pending: deque[Future[R]] = deque()
        for start in starts:
            pending.append(pool.submit(work, start))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _read_chunk(slide: Slide, coords: np.ndarray, params: TileParams) -> tuple[np.ndarray, np.ndarray]:
    """(tiles (k, P, P, 3) uint8, unreadable (k,) bool); an unreadable tile is left white."""
    tiles = np.empty((len(coords), params.tile_px, params.tile_px, 3), np.uint8)  # (k, P, P, 3)
    bad = np.zeros(len(coords), bool)
    for j, (x, y) in enumerate(coords):
        try:
            tiles[j] = slide.read_region_um(int(x), int(y), params.tile_um, params.target_mpp)
        except SlideError as exc:  # one corrupt JPEG tile must not cost the whole slide
            log.warning("%s: tile skipped: %s", slide.path.name, exc)
            tiles[j] = 255
            bad[j] = True
    return tiles, bad


def _tile_open_slide(
    slide: Slide, source: SlideSource, job: TileJob, paths: TileOutputs, mpp_source: str
) -> TileCounts:
    """The four steps of one slide: tissue, filters (+ pixels), QC image, tile file (last: "done")."""
    found = find_tissue(slide, job.params)
    reasons, counts = _filter_tiles(slide, found, job, paths.zarr, source.slide_id)
    save_png(paths.qc, _qc_image(found, reasons, slide.dimensions))
    kept = found.candidates[reasons == KEPT]
    write_tile_file(
        paths.h5,
        coords=found.grid.coords[kept],
        coords_um=found.grid.coords_um[kept],
        attrs=_tile_file_attrs(slide, source, job.params, counts, mpp_source),
    )
    log.debug("%s: %s", source.slide_id, counts)
    return counts


def _filter_tiles(
    slide: Slide, found: TissueGrid, job: TileJob, zarr_path: Path, slide_id: str
) -> tuple[np.ndarray, TileCounts]:
    """(M,) reason code per candidate and the counts; with --save-tiles the kept pixels stream into the
    zarr, which is committed only when the slide passes (else removed, leaving no partial pixels)."""
    params = job.params
    writer = _pixel_writer(zarr_path, params, slide_id, len(found.candidates)) if job.save_tiles else None
    try:
        reasons = np.empty(len(found.candidates), dtype=np.int8)  # (M,)
        done = 0
        for tiles, chunk_reasons in _classified_chunks(slide, found.candidate_coords, params, job.threads):
            reasons[done : done + len(tiles)] = chunk_reasons
            done += len(tiles)
            if writer is not None:
                writer.append(tiles[chunk_reasons == KEPT])
        counts = _count(found, reasons)
        _check_unreadable(slide, counts, params)
        if writer is not None:  # only a slide that passed commits its tile pixels
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return reasons, counts


def _pixel_writer(path: Path, params: TileParams, slide_id: str, n_max: int) -> TilePixelWriter:
    return TilePixelWriter(
        path,
        n_max=n_max,
        tile_px=params.tile_px,
        attrs={
            "slide_id": slide_id,
            "tile_size_um": params.tile_um,
            "tile_size_px": params.tile_px,
            "target_mpp": params.target_mpp,
            "params": json.dumps(params.to_dict(), sort_keys=True),  # a JSON string, as in the .h5
        },
    )


def _count(found: TissueGrid, reasons: np.ndarray) -> TileCounts:
    return TileCounts(
        n_grid=len(found.grid),
        n_tissue=len(found.candidates),
        n_background=int((reasons == BACKGROUND).sum()),
        n_blurry=int((reasons == BLURRY).sum()),
        n_unreadable=int((reasons == UNREADABLE).sum()),
        n_kept=int((reasons == KEPT).sum()),
    )


def _check_unreadable(slide: Slide, counts: TileCounts, params: TileParams) -> None:
    """A few corrupt JPEG tiles are skipped; a slide that is mostly unreadable is an error."""
    if counts.n_unreadable > params.max_unreadable_fraction * max(1, counts.n_tissue):
        raise SlideError(
            f"{slide.path}: {counts.n_unreadable} of {counts.n_tissue} tissue tiles could not be decoded "
            f"(more than max_unreadable_fraction={params.max_unreadable_fraction}); the file is damaged"
        )


def _qc_image(found: TissueGrid, reasons: np.ndarray, level0_size: tuple[int, int]) -> np.ndarray:
    w0, h0 = level0_size
    coords = found.candidate_coords
    return render_qc(
        found.thumb,
        found.mask,
        scale=(found.thumb.shape[1] / w0, found.thumb.shape[0] / h0),
        step_px=found.grid.step_px,
        kept=coords[reasons == KEPT],
        background=coords[reasons == BACKGROUND],
        blurry=coords[reasons == BLURRY],
    )


def _tile_file_attrs(
    slide: Slide, source: SlideSource, params: TileParams, counts: TileCounts, mpp_source: str
) -> dict[str, Any]:
    """Every attribute of a tile file (wsi.tilefile.REQUIRED_ATTRS and `mpp_source`, `n_unreadable`)."""
    w0, h0 = slide.dimensions
    return {
        "slide_id": source.slide_id,
        "slide_path": str(source.path),
        "tile_size_um": float(params.tile_um),
        "tile_size_px": int(params.tile_px),
        "mpp": float(slide.mpp),
        "mpp_source": mpp_source,
        "target_mpp": float(params.target_mpp),
        "level0_width": int(w0),
        "level0_height": int(h0),
        "backend": slide.backend,
        "vendor": slide.vendor,
        "params": params.to_dict(),  # stored as sorted-key JSON by write_tile_file
        "wsi_version": wsi.__version__,
        **counts.to_dict(),
    }

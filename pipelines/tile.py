"""The tile stage: slides -> tissue mask -> physical grid -> filtered tiles -> tile files + QC images.

Public API:

    TileJob(out_dir, params, backend="openslide", fallback_mpp=None, save_tiles=False,
            overwrite=False, threads=1)                 # picklable per-slide settings
    tile_slides(sources, *, out_dir, params=None, backend="openslide", mpp=None, workers=1,
                scheduler=None, overwrite=False, save_tiles=False, threads=None) -> list[ItemResult]
    tile_slide(source, job) -> ItemResult                # one slide (what each batch job runs)
    output_paths(out_dir, slide_id) -> TileOutputs      # .h5, .zarr, qc .png of one slide

Per slide, every file is written atomically and the tile file (.h5) last, so a complete tile file means
the slide is done. Each candidate tile is read once with `Slide.read_region_um`; the same pixels feed
the filters and the optional zarr cache, and reads run on a few threads (the backends release the GIL).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import wsi
from pipelines.batch import ItemResult, run_batch, write_manifest
from wsi.errors import MissingMppError
from wsi.qc import render_qc, save_png
from wsi.slide import Slide, open_slide
from wsi.sources import SlideSource
from wsi.tilefile import TilePixelWriter, is_complete, pixels_complete, read_tile_file, write_tile_file
from wsi.tiling import (
    BACKGROUND,
    BLURRY,
    KEPT,
    TileCounts,
    TileParams,
    classify_tiles,
    make_grid,
    tissue_fractions,
)
from wsi.tissue import tissue_mask

log = logging.getLogger(__name__)

#: tiles read and filtered together; big enough to vectorise the filters, small enough for memory
_CHUNK = 32


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
) -> list[ItemResult]:
    """Tile every slide; write `out_dir/tiles/manifest.csv`; return one ItemResult per slide.

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
    results = run_batch(
        sources, functools.partial(tile_slide, job=job), workers=workers, scheduler=scheduler, desc="tile"
    )
    write_manifest(job.out_dir / "tiles" / "manifest.csv", results)
    return results


def tile_slide(source: SlideSource, job: TileJob) -> ItemResult:
    """Tile one slide, or skip it when its complete output was made with the same settings."""
    paths = output_paths(job.out_dir, source.slide_id)
    done = _finished_kept(source, job, paths)
    if done is not None:
        return ItemResult(source.slide_id, str(source.path), "skipped", n=done)
    # Drop the old tile file first: from here on only a new, complete one may say "done".
    paths.h5.unlink(missing_ok=True)
    if not job.save_tiles and paths.zarr.exists():
        shutil.rmtree(paths.zarr, ignore_errors=True)  # made with other settings; would not match
    with _open(source, job) as slide:
        counts = _tile_open_slide(slide, source, job, paths)
    return ItemResult(source.slide_id, str(source.path), "ok", n=counts.n_kept)


def _open(source: SlideSource, job: TileJob) -> Slide:
    if source.mpp is not None:
        return open_slide(source.path, backend=job.backend, mpp=source.mpp)  # type: ignore[arg-type]
    try:
        return open_slide(source.path, backend=job.backend)  # type: ignore[arg-type]
    except MissingMppError:
        if job.fallback_mpp is None:
            raise
        return open_slide(source.path, backend=job.backend, mpp=job.fallback_mpp)  # type: ignore[arg-type]


def _mpp_source(source: SlideSource, slide: Slide, job: TileJob) -> str:
    if source.mpp is not None:
        return "slide list"
    if job.fallback_mpp is not None and slide.mpp == job.fallback_mpp:
        return "--mpp"
    return "metadata"


def _finished_kept(source: SlideSource, job: TileJob, paths: TileOutputs) -> int | None:
    """Kept-tile count of a complete, valid output made with these settings; None to (re)compute."""
    if job.overwrite or not is_complete(paths.h5):
        return None
    meta = read_tile_file(paths.h5)
    reason = None
    if meta.params != json.loads(job.params.to_json()):
        reason = "tile settings changed"
    elif meta.meta.get("slide_path") != str(source.path):
        reason = f"slide path changed (was {meta.meta.get('slide_path')})"
    elif source.mpp is not None and abs(meta.mpp - source.mpp) > 1e-9:
        reason = "mpp changed"
    elif meta.meta.get("mpp_source") == "--mpp" and job.fallback_mpp != meta.mpp:
        reason = "--mpp changed"
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
    """(k, P, P, 3) uint8 chunks of the tiles at `coords`, in order; the next chunk is read meanwhile."""

    def read(xy: np.ndarray) -> np.ndarray:
        return slide.read_region_um(int(xy[0]), int(xy[1]), params.tile_um, params.target_mpp)

    starts = range(0, len(coords), _CHUNK)
    if threads <= 1:
        for s in starts:
            yield np.stack([read(xy) for xy in coords[s : s + _CHUNK]])
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="tile-read") as pool:
        pending: deque[list[Future[np.ndarray]]] = deque()
        for s in starts:
            pending.append([pool.submit(read, xy) for xy in coords[s : s + _CHUNK]])
            if len(pending) > 1:
                yield np.stack([f.result() for f in pending.popleft()])
        while pending:
            yield np.stack([f.result() for f in pending.popleft()])


def _tile_open_slide(slide: Slide, source: SlideSource, job: TileJob, paths: TileOutputs) -> TileCounts:
    params = job.params
    w0, h0 = slide.dimensions
    thumb = slide.thumbnail_at(params.tissue.thumb_mpp)
    thumb_mpp = w0 * slide.mpp / thumb.shape[1]
    mask = tissue_mask(thumb, mpp=thumb_mpp, params=params.tissue)
    grid = make_grid(w0, h0, mpp=slide.mpp, tile_um=params.tile_um)
    fractions = tissue_fractions(grid, mask, level0_width=w0, level0_height=h0)
    candidates = np.flatnonzero(fractions >= params.min_tissue_fraction)

    reasons = np.empty(len(candidates), dtype=np.int8)
    writer = None
    if job.save_tiles:
        writer = TilePixelWriter(
            paths.zarr,
            n_max=len(candidates),
            tile_px=params.tile_px,
            attrs={
                "slide_id": source.slide_id,
                "tile_size_um": params.tile_um,
                "tile_size_px": params.tile_px,
                "target_mpp": params.target_mpp,
                "params": params.to_json(),
            },
        )
    try:
        done = 0
        for tiles in read_tile_chunks(slide, grid.coords[candidates], params, job.threads):
            chunk_reasons = classify_tiles(tiles, params)
            reasons[done : done + len(tiles)] = chunk_reasons
            done += len(tiles)
            if writer is not None:
                writer.append(tiles[chunk_reasons == KEPT])
        if writer is not None:
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise

    kept = candidates[reasons == KEPT]
    counts = TileCounts(
        n_grid=len(grid),
        n_tissue=len(candidates),
        n_background=int((reasons == BACKGROUND).sum()),
        n_blurry=int((reasons == BLURRY).sum()),
        n_kept=len(kept),
    )
    qc = render_qc(
        thumb,
        mask,
        scale=(thumb.shape[1] / w0, thumb.shape[0] / h0),
        step_px=grid.step_px,
        kept=grid.coords[kept],
        background=grid.coords[candidates[reasons == BACKGROUND]],
        blurry=grid.coords[candidates[reasons == BLURRY]],
    )
    save_png(paths.qc, qc)
    write_tile_file(
        paths.h5,
        coords=grid.coords[kept],
        coords_um=grid.coords_um[kept],
        attrs={
            "slide_id": source.slide_id,
            "slide_path": str(source.path),
            "tile_size_um": float(params.tile_um),
            "tile_size_px": int(params.tile_px),
            "mpp": float(slide.mpp),
            "mpp_source": _mpp_source(source, slide, job),
            "target_mpp": float(params.target_mpp),
            "level0_width": int(w0),
            "level0_height": int(h0),
            "backend": slide.backend,
            "vendor": slide.vendor,
            "params": params.to_json(),
            "wsi_version": wsi.__version__,
            **counts.as_attrs(),
        },
    )
    log.debug("%s: %s", source.slide_id, counts)
    return counts

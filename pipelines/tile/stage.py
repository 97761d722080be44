"""The tile stage: slides -> tissue mask -> physical grid -> filtered tiles -> tile files + QC pictures.

    tile_slides(sources, *, out_dir, options=None, params=None, segmentation=None, **settings) -> TileResult
    tile_slide(source, job) -> TileSlideResult     # one slide: what each batch job runs

Per slide (`steps.py`): read the tissue thumbnail and the QC picture in one go, find the tissue and the
candidate cells (`wsi.tiling.grid.find_tissue`), read and filter every candidate (`filters.py`), write
the QC picture and its GeoJSON, then the tile file: the kept tiles after any `--review` and every
candidate with its verdict, so a new review is applied from the tile file alone. Every file is written
atomically and the tile file (.h5) last: a complete tile file means the slide is done. Statuses: ok,
skipped (done by an earlier run with the same settings), empty (kept no tile: the row says why), failed.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wsi.core.config import with_settings
from wsi.core.errors import ConfigError
from wsi.core.suffixes import TILE_FILE_SUFFIX
from wsi.formats.tile_file import TileFile, is_complete, pixels_complete, read_tile_file
from wsi.pipelines.scheduling.jobs import JobsInterrupted, run_jobs, write_manifest
from wsi.pipelines.scheduling.remote import mirrored_job
from wsi.pipelines.tile.checks import (
    check_moved,
    check_same_slide,
    check_unchanged,
    check_usable_id,
    refuse_id_clashes,
    slide_changed,
)
from wsi.pipelines.tile.config import TileOptions
from wsi.pipelines.tile.findings import TileResult, TileSlideResult
from wsi.pipelines.tile.job import TileJob, TileOutputs, output_paths, remote_files
from wsi.pipelines.tile.mpp import OVERRIDE_SOURCE, open_with_mpp, refuse_images_without_mpp
from wsi.pipelines.tile.qupath import load_roi, roi_digest
from wsi.pipelines.tile.read import default_threads, read_tile_chunks
from wsi.pipelines.tile.review import check_review_option, load_review, rereview, review_digest
from wsi.pipelines.tile.segment import SegmentationOptions, same_models, segmenters
from wsi.pipelines.tile.steps import OpenSlide, tile_open_slide
from wsi.slides.sources import SlideSource
from wsi.storage import Mirror, remote_output
from wsi.storage.folder_lock import output_lock
from wsi.storage.identity import current_fingerprint
from wsi.tiling.params import TileParams

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

__all__ = [
    "TileJob", "TileOutputs", "default_threads", "output_paths", "read_tile_chunks", "tile_slide",
    "tile_slides",
]  # fmt: skip


#: the tile stage's closing line: what its count is and what its statuses mean (the CLI's line too)
TILE_UNIT = "tiles kept"
TILE_LABELS = {"ok": "tiled", "skipped": "already done"}


def tile_slides(
    sources: Sequence[SlideSource],
    *,
    out_dir: str | os.PathLike[str],
    params: TileParams | None = None,
    options: TileOptions | None = None,
    segmentation: SegmentationOptions | None = None,
    **settings: Any,
) -> TileResult:
    """Tile every slide; write `out_dir/tiles/manifest.csv`; return one row per slide, in order.

    `options` (or its fields as keywords, `settings`: backend, mpp, workers, threads, ...) say how to
    read and schedule (`TileOptions`); `params` which tiles to keep. A slide whose id is unusable,
    repeats an earlier slide's id (or differs from it only by case) is a failed row naming both files;
    the others run.
    """
    opts = with_settings(TileOptions, options, settings, source="tile_slides options")
    start = time.perf_counter()
    remote = remote_output(out_dir)  # a URL: this machine's mirror of it (checked writable)
    job = _tile_job(opts, out_dir, remote, params, segmentation)
    if job.segmentation is not None:
        segmenters(job.segmentation)  # a wrong weights file is one error before any slide, not one per slide
    sources = list(sources)
    check_review_option(job.review, job.out_dir, [src.slide_id for src in sources])  # ConfigError
    with output_lock(job.out_dir):  # one writer: two runs would each rewrite the manifest from their view
        if remote is not None:  # the finished tile files and the manifest, for the id checks and resume
            remote.pull_folder("tiles", suffixes=(TILE_FILE_SUFFIX, ".csv"))
        refused = refuse_id_clashes(sources, job.out_dir)
        refuse_images_without_mpp(  # MissingMppError: no slide has been read
            [s for i, s in enumerate(sources) if i not in refused], job.fallback_mpp,
            done=lambda src: is_complete(output_paths(job.out_dir, src.slide_id).h5),
        )  # fmt: skip
        for i, reason in refused.items():
            log.warning("%s: refused: %s", sources[i].slide_id, reason)
        todo = [src for i, src in enumerate(sources) if i not in refused]
        work = functools.partial(mirrored_job, fn=_tile_checked_slide, job=job, files=remote_files)
        # one process: two slides at a time, so one slide's single-threaded steps (mask, QC picture,
        # files) overlap the other's reads and filters and both cores stay busy
        at_once = min(2, os.cpu_count() or 1)
        try:
            ran = iter(
                run_jobs(
                    todo, work, workers=opts.workers, scheduler=opts.scheduler, desc="tile",
                    at_once=at_once, progress=opts.progress, unit=TILE_UNIT, labels=TILE_LABELS,
                )
            )  # fmt: skip
        except JobsInterrupted as stop:  # Ctrl-C: the manifest records the slides that were finished
            done = iter(None if r is None else TileSlideResult.row(r) for r in stop.finished)
            rows = [_refused(s, refused[i]) if i in refused else next(done) for i, s in enumerate(sources)]
            _record([r for r in rows if r is not None], job, remote)
            raise
        results = [
            _refused(src, refused[i]) if i in refused else TileSlideResult.row(next(ran))
            for i, src in enumerate(sources)
        ]
        _record(results, job, remote)
    where = str(remote.url) if remote is not None else job.out_dir
    seconds = time.perf_counter() - start
    return TileResult("tile", where, tuple(results), seconds, manifest=f"{where}/tiles/manifest.csv")


def _tile_job(
    opts: TileOptions, out_dir: str | os.PathLike[str], remote: Mirror | None, params: TileParams | None,
    segmentation: SegmentationOptions | None,
) -> TileJob:  # fmt: skip
    """What every slide's job carries, with its paths made absolute (a worker may run elsewhere); a remote
    --out refuses --save-tiles (one upload per tile)."""
    if remote is not None and opts.save_tiles:
        raise ConfigError(
            f"--save-tiles with a remote --out ({remote.url}) would upload one object per tile; leave it "
            "out (the embed stage reads the tiles from the slide) or give a local --out"
        )
    job = TileJob(
        out_dir=remote.local if remote is not None else Path(out_dir).absolute(),
        params=params or TileParams(),
        backend=opts.backend,
        fallback_mpp=opts.mpp,
        save_tiles=opts.save_tiles,
        overwrite=opts.overwrite,
        background=opts.background,
        threads=opts.threads or default_threads(opts.workers if opts.scheduler is None else 1),
        roi=None if opts.roi is None else Path(opts.roi).absolute(),
        review=None if opts.review is None else Path(opts.review).absolute(),
        mpp_override=opts.mpp_override,
        segmentation=segmentation if segmentation is not None and segmentation.active else None,
        remote=None if remote is None else str(remote.url),
        max_read_px=opts.max_read_px,
    )
    return job


def _refused(source: SlideSource, why: str) -> TileSlideResult:
    return TileSlideResult(source.slide_id, str(source.path), "failed", error=why)


def _record(results: list[TileSlideResult], job: TileJob, remote: Mirror | None) -> None:
    write_manifest(job.out_dir / "tiles" / "manifest.csv", results)
    if remote is not None:
        remote.push(["tiles/manifest.csv"])


def tile_slide(source: SlideSource, job: TileJob) -> TileSlideResult:
    """Tile one slide, or skip it when its complete output was made with the same settings.

    Status "empty" (with the reason in `error`) when the slide kept no tile: never a silent "ok". An ok
    slide of which some part could not be decoded says where in `error`.
    """
    check_usable_id(source.slide_id)
    return _tile_checked_slide(source, job)


def _tile_checked_slide(source: SlideSource, job: TileJob) -> TileSlideResult:
    """`tile_slide` for a slide whose id `tile_slides` checked with the whole batch."""
    paths = output_paths(job.out_dir, source.slide_id)
    previous = read_tile_file(paths.h5) if is_complete(paths.h5) else None
    # another slide file made these tiles: refused while it exists; gone, it was probably moved
    moved = previous is not None and check_same_slide(
        source, previous.meta, paths.h5, overwrite=job.overwrite
    )
    current = current_fingerprint(source.path)  # a stat and the header: the slide as it is now
    if previous is not None and not moved:
        changed = slide_changed(previous.meta, current)
        if changed:  # replaced at the same place: its tiles are never reused
            log.info(
                "%s: recomputing (the slide file changed since it was tiled: %s)", source.slide_id, changed
            )
        else:
            done = _finished(source, job, paths, previous)
            if done is not None:
                return done
    roi = load_roi(job.roi, source.slide_id)  # an unusable ROI or review leaves old output alone, too
    review = load_review(job.review, source.slide_id)
    # a slide that cannot be opened leaves old output alone
    slide, mpp_source, mpp_note = open_with_mpp(source, job.backend, job.fallback_mpp, job.mpp_override)
    with slide:
        if moved and previous is not None:
            check_moved(slide, source, previous, paths.h5, current)
        # Drop the old tile file first: from here on only a new, complete one may say "done".
        paths.h5.unlink(missing_ok=True)
        if not job.save_tiles and paths.zarr.exists():
            shutil.rmtree(paths.zarr, ignore_errors=True)  # made with other settings; would not match
        at = OpenSlide(slide, source, job, paths, mpp_source, mpp_note, roi, review, current)
        meta, note = tile_open_slide(at)
    check_unchanged(source, current, paths.h5)  # replaced while it was read: its tile file goes
    if meta.empty_reason:
        log.warning("%s: %s", source.slide_id, meta.empty_reason)
        why = meta.empty_reason
        return TileSlideResult.of(source.slide_id, str(source.path), "empty", meta, n=0, error=why)
    if meta.low_yield:
        log.warning("%s: %s", source.slide_id, meta.low_yield)
    return TileSlideResult.of(source.slide_id, str(source.path), "ok", meta, n=meta.n_kept, error=note)


def _finished(
    source: SlideSource, job: TileJob, paths: TileOutputs, meta: TileFile
) -> TileSlideResult | None:
    """The result of a complete, valid output made with these settings (skipped, or empty again with its
    reason); None to (re)compute."""
    if job.overwrite:
        return None
    reason = None
    if meta.params != job.params.to_dict():  # the stored JSON, decoded; files of any version compare
        reason = "tile settings changed"
    elif meta.slide_path != str(source.path):
        reason = f"slide path changed (was {meta.slide_path})"
    elif source.mpp is not None and abs(meta.mpp - source.mpp) > 1e-9:
        reason = "mpp changed"
    elif source.mpp is None and meta.meta.mpp_source == "slide list":
        reason = f"the slide list no longer gives an mpp (was {meta.mpp:g})"
    elif meta.meta.mpp_source in ("--mpp", OVERRIDE_SOURCE) and job.fallback_mpp != meta.mpp:
        reason = f"--mpp changed (was {meta.mpp:g}, now {job.fallback_mpp})"
    elif job.save_tiles and not pixels_complete(paths.zarr, n=len(meta)):
        reason = "tile pixels (--save-tiles) missing or incomplete"
    elif not paths.qc.is_file():
        reason = "QC image missing"
    elif (meta.meta.background.choice if meta.meta.background else "auto") != job.background:
        reason = f"--background changed to {job.background}"
    elif (meta.meta.roi.sha256 if meta.meta.roi else "") != roi_digest(job.roi, source.slide_id):
        reason = "--roi changed"
    elif (meta.meta.mpp_source == OVERRIDE_SOURCE) != job.mpp_override:
        reason = "--mpp-override changed"
    elif not same_models(meta.meta, job.segmentation):
        reason = "segmentation models or their weights changed"
    elif len(meta) == 0 and meta.meta.empty_reason is None:
        reason = "no tile kept by a version that did not say why"
    if reason:
        log.info("%s: recomputing (%s)", source.slide_id, reason)
        return None
    if (meta.meta.review.sha256 if meta.meta.review else "") != review_digest(job.review, source.slide_id):
        return rereview(source, job, paths, meta)  # from the stored candidates; None: tile it again
    if len(meta) == 0:
        why = str(meta.meta.empty_reason)
        log.warning("%s: %s (already tiled; --overwrite redoes it)", source.slide_id, why)
        return TileSlideResult.of(source.slide_id, str(source.path), "empty", meta.meta, n=0, error=why)
    return TileSlideResult.of(source.slide_id, str(source.path), "skipped", meta.meta, n=len(meta))

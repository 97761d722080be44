"""The tile stage: slides -> tissue mask -> physical grid -> filtered tiles -> tile files + QC pictures.

    tile_slides(sources, *, out_dir, options=None, params=None, segmentation=None, **settings) -> TileResult
    tile_slide(source, job) -> TileSlideResult     # one slide: what each batch job runs

Per slide: read the tissue thumbnail and the QC picture in one go, find the tissue and the candidate cells
(`wsi.tiling.grid.find_tissue`), read and filter every candidate (`filters.py`), write the QC picture
and its GeoJSON, then the tile file: the kept tiles after any `--review` and every candidate with its
verdict, so a new review is applied from the tile file alone. Every file is written atomically and the
tile file (.h5) last: a complete tile file means the slide is done. Statuses: ok, skipped (done by an
earlier run with the same settings), empty (kept no tile: the row says why), failed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from wsi.core.config import with_settings
from wsi.core.errors import ConfigError
from wsi.core.suffixes import TILE_FILE_SUFFIX
from wsi.core.work_bounds import check_grid
from wsi.formats.qupath import ReviewFile, Roi
from wsi.formats.tile_file import Candidates, TileFile, is_complete, pixels_complete, read_tile_file
from wsi.formats.tile_meta import BackgroundRecord, MaskRecord, RoiRecord, TileFileMeta
from wsi.pipelines.scheduling.jobs import JobsInterrupted, run_jobs, write_manifest
from wsi.pipelines.scheduling.remote import mirrored_job
from wsi.pipelines.tile.artifacts import COLOUR_NAMES, ink_colour_counts
from wsi.pipelines.tile.checks import (
    check_moved,
    check_same_slide,
    check_unchanged,
    check_usable_id,
    damage_note,
    damage_record,
    explain_empty,
    refuse_id_clashes,
    slide_changed,
)
from wsi.pipelines.tile.config import TileOptions
from wsi.pipelines.tile.filters import filter_tiles
from wsi.pipelines.tile.findings import TileResult, TileSlideResult, artifact_empty, upsampling_note
from wsi.pipelines.tile.job import TileJob, TileOutputs, output_paths, remote_files
from wsi.pipelines.tile.mpp import OVERRIDE_SOURCE, open_with_mpp, refuse_images_without_mpp
from wsi.pipelines.tile.output import tile_file_meta
from wsi.pipelines.tile.qupath import load_roi, restrict_to_roi, roi_digest, roi_empty, write_qc_geojson
from wsi.pipelines.tile.read import default_threads, read_tile_chunks
from wsi.pipelines.tile.review import (
    TilePixels,
    check_review_option,
    load_review,
    rereview,
    review_digest,
    write_tiles,
)
from wsi.pipelines.tile.segment import (
    SegmentationOptions,
    artifact_reason_names,
    artifact_verdicts,
    model_tissue_mask,
    same_models,
    segmentation_record,
    segmenters,
)
from wsi.slides.slide import Slide
from wsi.slides.sources import SlideSource
from wsi.slides.thumbnail import Thumbnail, read_thumbnails
from wsi.storage import Mirror, remote_output
from wsi.storage.folder_lock import output_lock
from wsi.storage.identity import SlideFingerprint, current_fingerprint
from wsi.tiling.artifacts import INK
from wsi.tiling.grid import KEPT, REASON_NAMES, TileCounts, TissueGrid, find_tissue
from wsi.tiling.params import TileParams
from wsi.tiling.qc import QcExtras, qc_picture_mpp, save_png, tile_qc_image

if TYPE_CHECKING:
    from wsi.models.segmentation import Segmenter
    from wsi.slides.tiff_tiles import FileDamage

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
        at = _OpenSlide(slide, source, job, paths, mpp_source, mpp_note, roi, review, current)
        meta, note = _tile_open_slide(at)
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


@dataclass(frozen=True)
class _OpenSlide:
    """One open slide and what this run knows of it besides its pixels: the helpers of one slide's steps
    all read these, so they travel together."""

    slide: Slide
    source: SlideSource
    job: TileJob
    paths: TileOutputs
    mpp_source: str
    mpp_note: str
    roi: Roi | None = None
    review: ReviewFile | None = None
    fingerprint: SlideFingerprint | None = None


@dataclass(frozen=True)
class _Tissue:
    """Where the tissue and the candidate tiles are, with the pictures and networks that found them."""

    found: TissueGrid
    thumbs: tuple[Thumbnail, ...]
    tissue_net: Segmenter | None
    artifact_net: Segmenter | None
    roi_record: RoiRecord | None
    roi_note: str


def _tile_open_slide(at: _OpenSlide) -> tuple[TileFileMeta, str]:
    """The four steps of one slide: tissue, filters (+ pixels), QC image (the filters' verdicts), tile
    file (last: "done"; the review applied). Returns the tile file's record and what could not be decoded.
    """
    slide, source, job, paths = at.slide, at.source, at.job, at.paths
    tissue = _find_tissue(at)
    found, artifact_net = tissue.found, tissue.artifact_net
    artifacts = None
    if artifact_net is not None and job.segmentation is not None:  # judged first: rejected tiles are not read
        artifacts = artifact_verdicts(slide, artifact_net, found, job.segmentation.max_artifact_fraction)
    upsampling, coarse = upsampling_note(slide.mpp, job.params.target_mpp)
    if coarse:
        log.warning("%s: %s", source.slide_id, coarse)
    colours = found.region_colours.copy() if found.region_colours is not None else None
    reasons, counts, damage = filter_tiles(
        slide, found, job, paths.zarr, source.slide_id, artifacts, colours=colours
    )
    if colours is not None:
        colours[reasons != INK] = 0
    note = damage_note(counts, damage, found)
    if note:
        log.warning("%s: %s", source.slide_id, note)
    art_names = artifact_reason_names(artifact_net) if artifact_net else {}
    empty = _empty_reason(at, tissue, counts, reasons, art_names, coarse) if counts.n_kept == 0 else ""
    if tissue.roi_note:  # also in the manifest note (the tile file's RoiRecord)
        log.warning("%s: %s", source.slide_id, tissue.roi_note)
    _write_qc(at, tissue, reasons, damage, art_names, colours)
    names = {code: name for name, code in art_names.items()}  # an artifact network's classes
    meta = _tile_meta(at, tissue, counts, reasons, damage, colours, upsampling, empty)
    cells = found.candidates
    candidates = Candidates(
        coords=found.grid.coords[cells], coords_um=found.grid.coords_um[cells], reasons=reasons,
        names={**REASON_NAMES, **names}, empty_reason=empty, ink_colours=colours,
        colour_names=COLOUR_NAMES if colours is not None else {},
    )  # fmt: skip
    pixels = TilePixels(
        save=job.save_tiles, held=reasons == KEPT if job.save_tiles else None,
        opener=lambda: contextlib.nullcontext(slide), threads=job.threads,
    )  # fmt: skip
    meta = write_tiles(paths, meta, candidates, at.review, params=job.params, pixels=pixels)
    log.debug("%s: %s", source.slide_id, meta.counts)
    return meta, note


def _find_tissue(at: _OpenSlide) -> _Tissue:
    """Thumbnails read once, the tissue (a network's mask when one is given) and its candidate cells, cut
    to the ROI: the grid is checked before any pixel is read, so an impossible grid costs no reading."""
    slide, source, job, roi = at.slide, at.source, at.job, at.roi
    thumb_mpp = job.params.tissue.thumb_mpp
    qc_mpp = qc_picture_mpp(slide.dimensions, slide.mpp, thumb_mpp)
    check_grid(slide.path, *slide.dimensions, mpp=slide.mpp, tile_um=job.params.tile_um)  # before reading
    mpps = (thumb_mpp,) if qc_mpp is None else (thumb_mpp, qc_mpp)
    thumbs = read_thumbnails(slide, mpps, max_read_px=job.max_read_px)
    tissue_net, artifact_net = segmenters(job.segmentation) if job.segmentation else (None, None)
    model_mask = model_tissue_mask(slide, tissue_net, thumbs[0], job.params) if tissue_net else None
    found = find_tissue(slide, job.params, background=job.background, thumbnail=thumbs[0], mask=model_mask)
    found, roi_record, roi_note = restrict_to_roi(found, roi, slide.dimensions, slide.mpp)
    if found.background.dark:
        log.warning(
            "%s: %s: tiled as such (tissue = what shines, background = near-black pixels, focus measured on "
            "the brightest channel; --background light|dark forces a kind). Encoders trained on H&E may not "
            "suit fluorescence.",
            source.slide_id, found.background.reason,
        )  # fmt: skip
    return _Tissue(found, thumbs, tissue_net, artifact_net, roi_record, roi_note)


def _empty_reason(
    at: _OpenSlide, tissue: _Tissue, counts: TileCounts, reasons: np.ndarray, art_names: dict[str, int],
    coarse: str,
) -> str:  # fmt: skip
    """Why a slide kept no tile, in the words a user acts on: the artifact network's share, else the
    filter that rejected most; the ROI when it held no tissue; then the notes that may explain it."""
    slide, job, roi, artifact_net = at.slide, at.job, at.roi, tissue.artifact_net
    found, roi_record, roi_note, mpp_note = tissue.found, tissue.roi_record, tissue.roi_note, at.mpp_note
    art_counts = {name: int((reasons == code).sum()) for name, code in art_names.items()}
    seg = (
        (artifact_net.spec.name, job.segmentation.max_artifact_fraction)
        if artifact_net and job.segmentation
        else None
    )
    w0, h0 = slide.dimensions
    empty = (seg and artifact_empty(counts, art_counts, *seg)) or explain_empty(
        counts, job.params, tissue_found=bool(found.mask.any()), background=found.background,
        size_um=(w0 * slide.mpp, h0 * slide.mpp),
    )  # fmt: skip
    empty = roi_empty(roi, slide.dimensions, roi_record, len(found.candidates)) or empty
    empty += "".join(f"; also: {extra}" for extra in (mpp_note, coarse, roi_note) if extra)
    return empty


def _write_qc(
    at: _OpenSlide, tissue: _Tissue, reasons: np.ndarray, damage: FileDamage | None,
    art_names: dict[str, int], colours: np.ndarray | None,
) -> None:  # fmt: skip
    """The QC picture and its GeoJSON: every candidate coloured by its filters' verdict, before the tile
    file, so a finished tile file always has its pictures."""
    slide, source, job, paths = at.slide, at.source, at.job, at.paths
    found, thumbs = tissue.found, tissue.thumbs
    extras = QcExtras(
        picture=thumbs[1] if len(thumbs) > 1 else None, unreadable=damage.regions if damage else (),
        extra_fates=art_names, ink_colours=ink_colour_counts(reasons, colours),
    )  # fmt: skip
    picture = tile_qc_image(
        slide, found, reasons, slide_id=source.slide_id, mpp_source=at.mpp_source, params=job.params,
        extras=extras,
    )  # fmt: skip
    save_png(paths.qc, picture)
    names = {code: name for name, code in art_names.items()}  # an artifact network's classes
    write_qc_geojson(paths.geojson, slide, found, reasons, source.slide_id, names)


def _tile_meta(
    at: _OpenSlide, tissue: _Tissue, counts: TileCounts, reasons: np.ndarray, damage: FileDamage | None,
    colours: np.ndarray | None, upsampling: float, empty: str,
) -> TileFileMeta:  # fmt: skip
    """The tile file's record of the filters' verdicts (counts, background, mask, damage, models), which
    `write_tiles` then updates with the review."""
    slide, source, job, found, mpp_source = at.slide, at.source, at.job, tissue.found, at.mpp_source
    bg = found.background
    return tile_file_meta(
        slide, source, job.params, counts, mpp_source,
        background=BackgroundRecord(kind=bg.kind, reason=bg.reason, choice=job.background),
        empty_reason=empty, damage=damage_record(found, damage), roi=tissue.roi_record,
        mask=None if found.left_out is None else MaskRecord(
            tissue_mm2=found.left_out.tissue_mm2, glass_mm2=found.left_out.glass_mm2,
            ink_mm2=found.left_out.ink_mm2, debris_mm2=found.left_out.debris_mm2,
        ),
        ink_colours=ink_colour_counts(reasons, colours),
        upsampling=float(upsampling),  # the low-yield note: write_tiles, after any review
        segmentation=None if job.segmentation is None
        else segmentation_record(job.segmentation, tissue.tissue_net, tissue.artifact_net, reasons),
        fingerprint=at.fingerprint,
    )  # fmt: skip

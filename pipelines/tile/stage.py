"""The tile stage: slides -> tissue mask -> physical grid -> filtered tiles -> tile files + QC images.

Public API:

    TileJob(out_dir, params, backend="openslide", fallback_mpp=None, save_tiles=False,
            overwrite=False, threads=1, background="auto")   # picklable per-slide settings
    tile_slides(sources, *, out_dir, params=None, backend="openslide", mpp=None, workers=1,
                scheduler=None, overwrite=False, save_tiles=False, threads=None,
                background="auto") -> list[JobResult]
    tile_slide(source, job) -> JobResult                # one slide (what each batch job runs)
    output_paths(out_dir, slide_id) -> TileOutputs      # .h5, .zarr, qc .png and .geojson of one slide
    read_tile_chunks, default_threads                  # re-exported from pipelines.tile_read

Per slide (`_tile_open_slide`): read the tissue thumbnail and the QC picture in one go
(`wsi.thumbnail.read_thumbnails`), find the tissue and the candidate grid cells (`wsi.tiling.find_tissue`,
which also tells a dark-background fluorescence-like slide from a brightfield one), read and filter every
candidate (`pipelines.tile_read`), write the QC image (`wsi.qc`; GeoJSON `.qupath`), then the tile file. Every
file is written atomically and the tile file (.h5) last, so a complete tile file means the slide is done.

A corrupt tile in the file costs the tiles that touch it: they are counted unreadable and the bad
stored tiles named (level-0 px) in one warning, the manifest row, the tile file (`unreadable_regions`)
and the QC picture. The slide fails only when the file is damaged beyond `max_unreadable_fraction` of
its own tiles under the tissue (`pipelines.tile_checks.check_damage`).

Statuses: ok (tiles kept), skipped (done by an earlier run), empty (ran, kept no tile: the row says which
filter rejected most and which option controls it), failed. Before any slide runs, ids that are unusable,
repeated, or equal but for case are refused per slide (`pipelines.tile_checks`); an id whose finished
tile file in --out came from another slide file is refused without --overwrite, naming both files.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import wsi
from wsi.config import with_settings
from wsi.errors import MissingMppError
from wsi.pipelines.jobs import JobResult, run_jobs, write_manifest
from wsi.pipelines.tile.artifacts import artifact_note, count_reasons
from wsi.pipelines.tile.checks import (
    check_damage,
    check_moved,
    check_same_slide,
    check_usable_id,
    damage_attrs,
    damage_note,
    explain_empty,
    file_damage,
    ignored_fallback_mpp,
    metadata_mpp,
    mpp_disagreement,
    refuse_id_clashes,
)
from wsi.pipelines.tile.config import TileOptions
from wsi.pipelines.tile.qupath import load_roi, restrict_to_roi, roi_digest, roi_empty, write_qc_geojson
from wsi.pipelines.tile.read import classified_chunks, default_threads, read_tile_chunks
from wsi.qc import qc_picture_mpp, save_png, tile_qc_image
from wsi.qupath import Roi
from wsi.slide import Slide, open_slide
from wsi.sources import SlideSource
from wsi.thumbnail import read_thumbnails
from wsi.tiff_tiles import FileDamage, FileTileProbe
from wsi.tile_file import (
    TileFile,
    TilePixelWriter,
    is_complete,
    pixels_complete,
    read_tile_file,
    write_tile_file,
)
from wsi.tile_params import TileParams
from wsi.tiling import KEPT, TileCounts, TissueGrid, find_tissue

log = logging.getLogger(__name__)

__all__ = [
    "TileJob",
    "TileOutputs",
    "default_threads",
    "output_paths",
    "read_tile_chunks",
    "tile_slide",
    "tile_slides",
]


@dataclass(frozen=True)
class TileOutputs:
    h5: Path
    zarr: Path
    qc: Path
    geojson: Path  # the QC picture's content as QuPath objects (pipelines.tile.qupath)


def output_paths(out_dir: str | os.PathLike[str], slide_id: str) -> TileOutputs:
    out = Path(out_dir)
    return TileOutputs(
        out / "tiles" / f"{slide_id}.h5", out / "tiles" / f"{slide_id}.zarr", out / "qc" / f"{slide_id}.png",
        out / "qc" / f"{slide_id}.geojson",
    )  # fmt: skip


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
    #: "auto": tell brightfield from dark-background (fluorescence-like) slides per slide; "light" or
    #: "dark" forces one kind (not a TileParams field: it describes the slide, like its mpp)
    background: str = "auto"
    #: QuPath GeoJSON annotations restricting the tiles: one file, or a folder of <slide_id>.geojson
    roi: Path | None = None


def tile_slides(
    sources: Sequence[SlideSource],
    *,
    out_dir: str | os.PathLike[str],
    params: TileParams | None = None,
    options: TileOptions | None = None,
    **settings: Any,
) -> list[JobResult]:
    """Tile every slide; write `out_dir/tiles/manifest.csv`; return one JobResult per slide, in order.

    `options` (or its fields as keywords, `settings`: backend, mpp, workers, threads, ...) say how to
    read and schedule (`TileOptions`); `params` which tiles to keep. A slide whose id is unusable,
    repeats an earlier slide's id (or differs from it only by case) is a failed row naming both files;
    the others run.
    """
    opts = with_settings(TileOptions, options, settings, source="tile_slides options")
    job = TileJob(
        out_dir=Path(out_dir).absolute(),
        params=params or TileParams(),
        backend=opts.backend,
        fallback_mpp=opts.mpp,
        save_tiles=opts.save_tiles,
        overwrite=opts.overwrite,
        threads=opts.threads or default_threads(opts.workers if opts.scheduler is None else 1),
        background=opts.background,
        roi=None if opts.roi is None else Path(opts.roi).absolute(),
    )
    sources = list(sources)
    refused = refuse_id_clashes(sources, job.out_dir)
    for i, reason in refused.items():
        log.warning("%s: refused: %s", sources[i].slide_id, reason)
    todo = [src for i, src in enumerate(sources) if i not in refused]
    work = functools.partial(tile_slide, job=job)
    ran = iter(run_jobs(todo, work, workers=opts.workers, scheduler=opts.scheduler, desc="tile"))
    results = [
        JobResult(src.slide_id, str(src.path), "failed", error=refused[i]) if i in refused else next(ran)
        for i, src in enumerate(sources)
    ]
    write_manifest(job.out_dir / "tiles" / "manifest.csv", results)
    return results


def tile_slide(source: SlideSource, job: TileJob) -> JobResult:
    """Tile one slide, or skip it when its complete output was made with the same settings.

    Status "empty" (with the reason in `error`) when the slide kept no tile: never a silent "ok". An ok
    slide of which some part could not be decoded says where in `error`.
    """
    check_usable_id(source.slide_id)  # a batch checked this already; a direct caller may not have
    paths = output_paths(job.out_dir, source.slide_id)
    previous = read_tile_file(paths.h5) if is_complete(paths.h5) else None
    # another slide file made these tiles: refused while it exists; gone, it was probably moved
    moved = previous is not None and check_same_slide(
        source, previous.meta, paths.h5, overwrite=job.overwrite
    )
    if previous is not None and not moved:
        done = _finished(source, job, paths, previous)
        if done is not None:
            return done
    roi = load_roi(job.roi, source.slide_id)  # an unusable ROI leaves old output alone, too
    slide, mpp_source, mpp_note = _open(source, job)  # a slide that cannot be opened leaves old output alone
    with slide:
        if moved and previous is not None:
            check_moved(slide, source, previous, paths.h5)
        # Drop the old tile file first: from here on only a new, complete one may say "done".
        paths.h5.unlink(missing_ok=True)
        if not job.save_tiles and paths.zarr.exists():
            shutil.rmtree(paths.zarr, ignore_errors=True)  # made with other settings; would not match
        counts, empty, note = _tile_open_slide(slide, source, job, paths, mpp_source, mpp_note, roi=roi)
    if empty:
        log.warning("%s: %s", source.slide_id, empty)
        return JobResult(source.slide_id, str(source.path), "empty", n=0, error=empty)
    rejected = artifact_note(counts.to_dict())  # tiles rejected per artifact, for the manifest
    return JobResult(source.slide_id, str(source.path), "ok", n=counts.n_kept, error=note, note=rejected)


def _open(source: SlideSource, job: TileJob) -> tuple[Slide, str, str]:
    """The open slide, where its mpp came from ("slide list", "metadata" or "--mpp"), and a warning
    ("" if none) when a given mpp is more than 2x from the slide's metadata."""
    backend = job.backend
    if source.mpp is not None:
        slide = open_slide(source.path, backend=backend, mpp=source.mpp)
        found = metadata_mpp(source.path, backend)
        note = mpp_disagreement(source.mpp, found, "the slide list (mpp column)")
        _warn(source, note)
        return slide, "slide list", note
    try:
        slide = open_slide(source.path, backend=backend)
    except MissingMppError:
        if job.fallback_mpp is None:
            raise
        return open_slide(source.path, backend=backend, mpp=job.fallback_mpp), "--mpp", ""
    if job.fallback_mpp is not None:
        _warn(source, ignored_fallback_mpp(job.fallback_mpp, slide.mpp))
    return slide, "metadata", ""


def _warn(source: SlideSource, note: str) -> None:
    if note:
        log.warning("%s: %s", source.slide_id, note)


def _finished(source: SlideSource, job: TileJob, paths: TileOutputs, meta: TileFile) -> JobResult | None:
    """The result of a complete, valid output made with these settings (skipped, or empty again with its
    reason); None to (re)compute."""
    if job.overwrite:
        return None
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
    elif meta.meta.get("background_choice", "auto") != job.background:
        reason = f"--background changed to {job.background}"
    elif meta.meta.get("roi_sha256", "") != roi_digest(job.roi, source.slide_id):
        reason = "--roi changed"
    elif len(meta) == 0 and "empty_reason" not in meta.meta:
        reason = "no tile kept by a version that did not say why"
    if reason:
        log.info("%s: recomputing (%s)", source.slide_id, reason)
        return None
    if len(meta) == 0:
        why = str(meta.meta["empty_reason"])
        log.warning("%s: %s (already tiled; --overwrite redoes it)", source.slide_id, why)
        return JobResult(source.slide_id, str(source.path), "empty", n=0, error=why)
    return JobResult(source.slide_id, str(source.path), "skipped", n=len(meta), note=artifact_note(meta.meta))


def _tile_open_slide(
    slide: Slide, source: SlideSource, job: TileJob, paths: TileOutputs, mpp_source: str, mpp_note: str,
    roi: Roi | None = None,
) -> tuple[TileCounts, str, str]:  # fmt: skip
    """The four steps of one slide: tissue, filters (+ pixels), QC image, tile file (last: "done").

    Returns the counts, why no tile was kept ("" when some were), and what could not be decoded ("").
    """
    thumb_mpp = job.params.tissue.thumb_mpp
    qc_mpp = qc_picture_mpp(slide.dimensions, slide.mpp, thumb_mpp)
    thumbs = read_thumbnails(slide, (thumb_mpp,) if qc_mpp is None else (thumb_mpp, qc_mpp))
    found = find_tissue(slide, job.params, background=job.background, thumbnail=thumbs[0])
    found, roi_attrs = restrict_to_roi(found, roi)
    if found.background.dark:
        log.warning(
            "%s: %s: tiled as such (tissue = what shines, background = near-black pixels, focus measured on "
            "the brightest channel; --background light|dark forces a kind). Encoders trained on H&E may not "
            "suit fluorescence.",
            source.slide_id, found.background.reason,
        )  # fmt: skip
    reasons, counts, damage = _filter_tiles(slide, found, job, paths.zarr, source.slide_id)
    note = damage_note(counts, damage, found)
    if note:
        log.warning("%s: %s", source.slide_id, note)
    empty = ""
    if counts.n_kept == 0:
        w0, h0 = slide.dimensions
        empty = explain_empty(
            counts, job.params, tissue_found=bool(found.mask.any()), background=found.background,
            size_um=(w0 * slide.mpp, h0 * slide.mpp),
        )  # fmt: skip
        empty = roi_empty(roi, slide.dimensions, roi_attrs, len(found.candidates)) or empty
        if mpp_note:
            empty += f"; also: {mpp_note}"
    picture = tile_qc_image(
        slide, found, reasons, slide_id=source.slide_id, mpp_source=mpp_source, params=job.params,
        picture=thumbs[1] if len(thumbs) > 1 else None, unreadable=damage.regions if damage else (),
    )  # fmt: skip
    save_png(paths.qc, picture)
    write_qc_geojson(paths.geojson, slide, found, reasons, source.slide_id)
    kept = found.candidates[reasons == KEPT]
    attrs = _tile_file_attrs(slide, source, job.params, counts, mpp_source)
    attrs.update(
        background=found.background.kind, background_reason=found.background.reason,
        background_choice=job.background, empty_reason=empty, **damage_attrs(found, damage), **roi_attrs,
    )  # fmt: skip
    write_tile_file(
        paths.h5, coords=found.grid.coords[kept], coords_um=found.grid.coords_um[kept], attrs=attrs
    )
    log.debug("%s: %s", source.slide_id, counts)
    return counts, empty, note


def _filter_tiles(
    slide: Slide, found: TissueGrid, job: TileJob, zarr_path: Path, slide_id: str
) -> tuple[np.ndarray, TileCounts, FileDamage | None]:
    """(M,) reason code per candidate, the counts and what could not be decoded (None: all was); with
    --save-tiles the kept pixels stream into the zarr, which is committed only when the slide passes
    (else removed, leaving no partial pixels)."""
    params = job.params
    writer = _pixel_writer(zarr_path, params, slide_id, len(found.candidates)) if job.save_tiles else None
    try:
        reasons = np.empty(len(found.candidates), dtype=np.int8)  # (M,)
        done = 0
        kind = found.background
        probe = FileTileProbe(slide, slide.best_level_for_mpp(params.target_mpp))
        chunks = classified_chunks(
            slide, found.candidate_coords, params, job.threads, dark=kind.dark, gain=kind.gain, probe=probe,
            region_codes=found.region_codes,
        )  # fmt: skip
        for tiles, chunk_reasons in chunks:
            reasons[done : done + len(tiles)] = chunk_reasons
            done += len(tiles)
            if writer is not None:
                writer.append(tiles[chunk_reasons == KEPT])
        counts = count_reasons(found, reasons)
        damage = file_damage(slide, found, probe) if counts.n_unreadable else None
        if damage is not None:
            check_damage(slide.path, counts, damage, params)
        if writer is not None:  # only a slide that passed commits its tile pixels
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return reasons, counts, damage


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


def _tile_file_attrs(
    slide: Slide, source: SlideSource, params: TileParams, counts: TileCounts, mpp_source: str
) -> dict[str, Any]:
    """The attributes of a tile file: wsi.tilefile.REQUIRED_ATTRS, `mpp_source` and the counts (the caller
    adds `background`, `background_reason`, `background_choice` and `empty_reason`)."""
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

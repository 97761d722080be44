"""The steps of tiling one open slide: tissue (and the ROI), filters (+ pixels), QC picture and GeoJSON
(the filters' verdicts), then the tile file (last: "done"; the review applied). `tile_slide` decides
whether a slide needs them; these steps do them.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from wsi.core.work_bounds import check_grid
from wsi.formats.qupath import ReviewFile, Roi
from wsi.formats.tile_file import Candidates
from wsi.formats.tile_meta import BackgroundRecord, MaskRecord, RoiRecord, TileFileMeta
from wsi.pipelines.tile.artifacts import COLOUR_NAMES, ink_colour_counts
from wsi.pipelines.tile.checks import damage_note, damage_record, explain_empty
from wsi.pipelines.tile.filters import filter_tiles
from wsi.pipelines.tile.findings import artifact_empty, coarse_filters_note, upsampling_note
from wsi.pipelines.tile.job import TileJob, TileOutputs
from wsi.pipelines.tile.output import tile_file_meta
from wsi.pipelines.tile.qupath import restrict_to_roi, roi_empty, write_qc_geojson
from wsi.pipelines.tile.review import TilePixels, write_tiles
from wsi.pipelines.tile.segment import (
    artifact_reason_names,
    artifact_verdicts,
    model_tissue_mask,
    segmentation_record,
    segmenters,
)
from wsi.slides.slide import Slide
from wsi.slides.sources import SlideSource
from wsi.slides.thumbnail import Thumbnail, read_thumbnails
from wsi.storage.identity import SlideFingerprint
from wsi.tiling.artifacts import INK
from wsi.tiling.grid import (
    KEPT,
    REASON_NAMES,
    TileCounts,
    TissueGrid,
    coarser_than,
    find_tissue,
    read_pixels,
)
from wsi.tiling.qc import QcExtras, qc_picture_mpp, save_png, tile_qc_image

if TYPE_CHECKING:
    from wsi.models.segmentation import Segmenter
    from wsi.slides.tiff_tiles import FileDamage

log = logging.getLogger("wsi.pipelines.tile.stage")  # one stage, one logger: its lines read as before

__all__ = ["OpenSlide", "tile_open_slide"]


@dataclass(frozen=True)
class OpenSlide:
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


def tile_open_slide(at: OpenSlide) -> tuple[TileFileMeta, str]:
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
    coarse_filters = coarse_filters_note(
        max(slide.mpp, tissue.thumbs[0].mpp), job.params.artifacts, ran="ink" in found.artifacts.masks
    )
    if coarse_filters:
        log.warning("%s: %s", source.slide_id, coarse_filters)
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


def _find_tissue(at: OpenSlide) -> _Tissue:
    """Thumbnails read once, the tissue (a network's mask when one is given) and its candidate cells, cut
    to the ROI: the grid is checked before any pixel is read, so an impossible grid costs no reading."""
    slide, source, job, roi = at.slide, at.source, at.job, at.roi
    thumb_mpp = job.params.tissue.thumb_mpp
    qc_mpp = qc_picture_mpp(slide.dimensions, slide.mpp, thumb_mpp)
    check_grid(slide.path, *slide.dimensions, mpp=slide.mpp, tile_um=job.params.tile_um)  # before reading
    mpps = (thumb_mpp,) if qc_mpp is None else (thumb_mpp, qc_mpp)
    # a slide coarser than the thumbnail (a plain image, a scan at 20-50 um/px): its filters judge its own
    # pixels, level 0 as read (wsi.tiling.grid.find_tissue)
    coarse = coarser_than(slide.mpp, thumb_mpp)
    read = read_thumbnails(slide, (*mpps, slide.mpp) if coarse else mpps, max_read_px=job.max_read_px)
    thumbs, own = (read[:-1], read[-1]) if coarse else (read, None)
    tissue_net, artifact_net = segmenters(job.segmentation) if job.segmentation else (None, None)
    model_mask = model_tissue_mask(slide, tissue_net, thumbs[0], job.params) if tissue_net else None
    found = find_tissue(
        slide, job.params, background=job.background, thumbnail=thumbs[0], mask=model_mask,
        own_pixels=None if own is None else read_pixels(own),
    )  # fmt: skip
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
    at: OpenSlide, tissue: _Tissue, counts: TileCounts, reasons: np.ndarray, art_names: dict[str, int],
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
    at: OpenSlide, tissue: _Tissue, reasons: np.ndarray, damage: FileDamage | None,
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
    at: OpenSlide, tissue: _Tissue, counts: TileCounts, reasons: np.ndarray, damage: FileDamage | None,
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

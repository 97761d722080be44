"""The tile stage's QuPath side: `--roi` annotations restrict the cells tiled, and qc/<slide_id>.geojson
shows the outcome as objects QuPath imports (`wsi.formats.qupath`).

ROI rule: a candidate cell (enough tissue in the thumbnail mask) is read only when its centre lies inside
an included region and outside every excluded one (`wsi.formats.qupath.read`); the centre, not the majority of
the tile, because it is one unambiguous point per tile and matches how a tile grid is drawn over a region.
The cells left out are counted (`n_outside_roi`) and the ROI file's sha256 is stored in the tile file, so
a changed ROI re-tiles the slide.

The QC GeoJSON holds the tissue outline (an annotation classed "Tissue") and every candidate tile as a
QuPath tile object classed by its fate (`wsi.tiling.grid.REASON_NAMES`: kept, background, blurry, ... and any
reason a filter adds), with its tissue fraction as a measurement; all in level-0 pixels.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wsi.formats.qupath import (
    QuPathClass,
    Roi,
    feature,
    feature_collection,
    mask_polygons,
    polygon_geometry,
    read_roi,
    roi_file_for,
    tile_features,
    write_geojson,
)
from wsi.formats.tile_meta import RoiRecord
from wsi.tiling.grid import REASON_NAMES, TissueGrid, tissue_fractions
from wsi.tiling.qc import FATE_RGB, OUTLINE_RGB

if TYPE_CHECKING:
    from wsi.slides.slide import Slide

log = logging.getLogger(__name__)

#: what the attributes say about the rule, for whoever reads a tile file later
ROI_RULE = "tile centre inside an included region and outside every excluded one"


def load_roi(roi: Path | None, slide_id: str) -> Roi | None:
    """The slide's ROI (None without --roi); RoiError for a missing or unusable file."""
    if roi is None:
        return None
    return read_roi(roi_file_for(roi, slide_id))


def roi_digest(roi: Path | None, slide_id: str) -> str:
    """sha256 of the slide's ROI file ("" without --roi, "missing" when it cannot be found): a finished
    slide whose stored digest differs is tiled again."""
    if roi is None:
        return ""
    from wsi.core.errors import RoiError
    from wsi.core.files import sha256_file

    try:
        return sha256_file(roi_file_for(roi, slide_id))
    except (RoiError, OSError):
        return "missing"


def restrict_to_roi(
    found: TissueGrid, roi: Roi | None, size: tuple[int, int], mpp: float
) -> tuple[TissueGrid, RoiRecord | None, str]:
    """The candidates whose centre the ROI holds, the tile file's record of it, and what is wrong with
    where the ROI lies on this slide of `size` level-0 px at `mpp` (`roi_fit_note`, "" when nothing)."""
    if roi is None:
        return found, None, ""
    note = roi_fit_note(found, roi, size, mpp)
    centres = found.candidate_coords.astype(np.float64) + found.grid.step_px / 2
    keep = roi.contains(centres)
    record = RoiRecord(
        path=str(roi.path),
        sha256=roi.sha256,
        rule=ROI_RULE,
        n_included=len(roi.include),
        n_excluded=len(roi.exclude),
        n_outside=int((~keep).sum()),
        note=note,
    )
    log.info("%s: %d of %d tissue cells inside", roi.describe(), int(keep.sum()), len(keep))
    return replace(found, candidates=found.candidates[keep]), record, note


def roi_fit_note(found: TissueGrid, roi: Roi | None, size: tuple[int, int], mpp: float) -> str:
    """What is wrong with where the ROI lies on this slide ("" when nothing is): its included regions
    reach beyond the slide's level-0 pixels, or it may be drawn in micrometres (QuPath's export is in
    pixels; a micrometre ROI on a 0.25 um/px slide lands in the top-left sixteenth and silently picks
    other tiles): it fits the slide's extent in micrometres, and read as micrometres it holds at least
    twice the tissue cells it holds as pixels. Either is a warning: the ROI is used as given.
    """
    box = roi.bounds() if roi is not None else None
    if roi is None or box is None:
        return ""
    w0, h0 = size
    span = f"its included regions span x {box[0]:.0f}-{box[2]:.0f}, y {box[1]:.0f}-{box[3]:.0f}"
    if box[0] < -0.02 * w0 or box[1] < -0.02 * h0 or box[2] > 1.02 * w0 or box[3] > 1.02 * h0:
        return (
            f"the ROI {roi.path.name} does not fit this slide: {span}, beyond its {w0} x {h0} level-0 px "
            "(another slide's export, or other units?)"
        )
    centres = found.candidate_coords.astype(np.float64) + found.grid.step_px / 2
    as_px = int(roi.contains(centres).sum())
    as_um = int(roi.contains(centres * mpp).sum())  # the same ROI read as micrometres
    fits_um = box[2] <= 1.02 * w0 * mpp and box[3] <= 1.02 * h0 * mpp  # within the slide in micrometres
    if mpp < 0.9 and fits_um and as_um >= max(2 * as_px, as_px + 5):
        return (
            f"the ROI {roi.path.name} may be drawn in micrometres: {span}, within the slide's "
            f"{w0 * mpp:.0f} x {h0 * mpp:.0f} um; read as level-0 pixels (the unit of QuPath's Export "
            f"objects) it holds {as_px} of the {len(centres)} tissue cells, read as micrometres {as_um}. "
            f"If so, export it again in pixels, or scale it by {1 / mpp:.4g}"
        )
    return ""


def roi_empty(roi: Roi | None, size: tuple[int, int], record: RoiRecord | None, n_left: int) -> str:
    """Why a slide kept no tile when the ROI left out all its tissue cells (likely another slide's
    ROI); "" otherwise."""
    n_before = (record.n_outside if record else 0) + n_left
    if roi is None or n_left or not n_before:
        return ""
    box = roi.bounds()
    where = (
        ""
        if box is None
        else f" (its included regions span x {box[0]:.0f}-{box[2]:.0f}, y {box[1]:.0f}-{box[3]:.0f})"
    )
    return (
        f"none of the {n_before} tissue cells has its centre inside the ROI {roi.path}{where} on a slide of "
        f"{size[0]} x {size[1]} level-0 px: check that the file is this slide's QuPath export"
    )


def write_qc_geojson(
    path: Path,
    slide: Slide,
    found: TissueGrid,
    reasons: np.ndarray,
    slide_id: str,
    extra_names: Mapping[int, str] | None = None,
) -> None:
    """qc/<slide_id>.geojson: tissue outline + every candidate tile classed by its fate (level-0 px).
    extra_names: reason code -> name beyond `REASON_NAMES` (an artifact network's "artifact: pen")."""
    w0, h0 = slide.dimensions
    features = []
    mask = found.mask
    if mask.any():
        polygons = mask_polygons(mask, scale=(w0 / mask.shape[1], h0 / mask.shape[0]))
        if polygons:
            features.append(
                feature(
                    polygon_geometry(polygons),
                    object_type="annotation",
                    name=f"{slide_id} tissue",
                    classification=QuPathClass.of("Tissue", OUTLINE_RGB),
                )
            )
    fractions = found.fractions  # of the mask alone: those of find_tissue unless part was unreadable
    if fractions is None or found.unknown is not None:
        fractions = tissue_fractions(found.grid, mask, level0_width=w0, level0_height=h0)
    fractions = fractions[found.candidates]
    classes = {int(c): _reason_class(int(c), extra_names or {}) for c in np.unique(reasons)}
    features += tile_features(
        found.candidate_coords, found.grid.step_px, object_type="tile",
        classes=[classes[int(c)] for c in reasons], measurements={"Tissue fraction": fractions},
    )  # fmt: skip
    counts = {classes[c].name: int((reasons == c).sum()) for c in classes}
    props = {
        "slide_id": slide_id, "units": "level-0 pixels", "level0_width": int(w0), "level0_height": int(h0),
        "mpp": float(slide.mpp), "tile_size_px0": float(found.grid.step_px), "tiles": counts,
    }  # fmt: skip
    write_geojson(path, feature_collection(features, props))


def _reason_class(code: int, extra_names: Mapping[int, str]) -> QuPathClass:
    name = REASON_NAMES.get(code) or extra_names.get(code, f"reason {code}")
    return QuPathClass.of(name, FATE_RGB.get(name))


__all__ = [
    "ROI_RULE", "load_roi", "restrict_to_roi", "roi_digest", "roi_empty", "roi_fit_note", "write_qc_geojson",
]  # fmt: skip

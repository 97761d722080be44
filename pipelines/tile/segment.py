"""Segmentation networks in the tile stage: the tissue mask from a tissue model, tiles rejected by an
artifact model (`wsi tile --tissue-model NAME --tissue-weights FILE --artifact-model NAME ...`).

Both run at their training resolution (`wsi.models.segmentation.named`) in windows of 512 px read from the
slide (`Slide.read_region_um`), on the device when there is one. Windows that are glass alone on the
tissue thumbnail (tissue model) or hold no tissue (artifact model) are not run, as GrandQC skips windows
without tissue. Each network's class per pixel is summed into the tissue thumbnail's pixels: a map of
class fractions at the thumbnail's size, from which the tissue mask (fraction of "tissue" over one half)
and each candidate tile's share of every artifact class follow.

A tile whose artifact share is over `max_artifact_fraction` is rejected for the artifact class that
covers most of it; the reasons are codes ARTIFACT_BASE + class index (`artifact_reason_names`), and the
tile file records each model's name, weights file and sha256 (`segmentation_record`).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from wsi.core.errors import ConfigError, WeightsError
from wsi.core.files import sha256_file
from wsi.formats.tile_meta import SegmentationModels, SegmentationRecord, TileFileMeta
from wsi.pipelines.tile.config import SegmentationOptions
from wsi.slides.slide import Slide
from wsi.slides.thumbnail import Thumbnail
from wsi.tiling.blur import min_rgb
from wsi.tiling.grid import KEPT, TissueGrid
from wsi.tiling.params import TileParams

if TYPE_CHECKING:  # torch comes in only when a network is asked for (`_segmenter`)
    from wsi.models.segmentation import Segmenter

log = logging.getLogger(__name__)

#: reason code of a tile rejected by the artifact model: ARTIFACT_BASE + the model's class index
ARTIFACT_BASE = 16
#: windows read and segmented per batch
_WINDOWS_PER_BATCH = 4


@functools.lru_cache(maxsize=4)
def _segmenter(name: str, weights: Path, kind: str, device: str, sha256: str) -> Segmenter:
    """One load per process and weights file content (a worker tiles many slides)."""
    from wsi.models.segmentation import load_segmenter
    from wsi.pipelines.scheduling.devices import resolve_device

    seg = load_segmenter(name, weights, kind=kind, device=resolve_device(device))  # type: ignore[arg-type]
    if seg.sha256 != sha256:
        raise ConfigError(f"{weights} changed while it was being read; run again")
    return seg


def segmenters(options: SegmentationOptions) -> tuple[Segmenter | None, Segmenter | None]:
    """(tissue, artifact) networks, loaded and key-checked (None where not asked for)."""
    tissue = artifact = None
    if options.tissue_model and options.tissue_weights:
        path = Path(options.tissue_weights)
        tissue = _segmenter(options.tissue_model, path, "tissue", options.device, _sha256(path))
    if options.artifact_model and options.artifact_weights:
        path = Path(options.artifact_weights)
        artifact = _segmenter(options.artifact_model, path, "artifact", options.device, _sha256(path))
    return tissue, artifact


def _sha256(path: Path) -> str:
    if not path.is_file():
        raise WeightsError(f"weights file {path} does not exist")
    return sha256_file(path)


def class_fractions(slide: Slide, seg: Segmenter, shape: tuple[int, int], where: np.ndarray) -> np.ndarray:
    """(C, h, w) float32: the share of each class of `seg` in every pixel of an (h, w) map of the slide.

    where: (h, w) bool, the map's pixels worth segmenting; windows holding none are skipped (their pixels
    stay 0 in every class).
    """
    spec = seg.spec
    n_classes = max(spec.classes) + 1 if spec.classes else 2
    h, w = shape
    w0, h0 = slide.dimensions
    sx, sy = w / w0, h / h0  # map px per level-0 px
    side_um = spec.window_px * spec.mpp
    step0 = side_um / slide.mpp  # window side in level-0 px
    counts = np.zeros((n_classes, h, w), np.float32)
    todo = []
    for j in range(int(np.ceil(h0 / step0))):
        for i in range(int(np.ceil(w0 / step0))):
            x0, y0 = round(i * step0), round(j * step0)
            box = where[
                int(y0 * sy) : int(np.ceil((y0 + step0) * sy)), int(x0 * sx) : int(np.ceil((x0 + step0) * sx))
            ]
            if box.any():
                todo.append((x0, y0))
    centre = (np.arange(spec.window_px) + 0.5) * (spec.mpp / slide.mpp)  # level-0 px of each window pixel
    for start in range(0, len(todo), _WINDOWS_PER_BATCH):
        batch = todo[start : start + _WINDOWS_PER_BATCH]
        windows = np.stack([slide.read_region_um(x0, y0, side_um, spec.mpp) for x0, y0 in batch])
        for (x0, y0), cls in zip(batch, seg.classify(windows), strict=True):
            _accumulate(counts, cls, np.floor((x0 + centre) * sx), np.floor((y0 + centre) * sy))
    total = counts.sum(axis=0, keepdims=True)
    return np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)


def _accumulate(counts: np.ndarray, cls: np.ndarray, tx: np.ndarray, ty: np.ndarray) -> None:
    """Add the (P, P) classes `cls` to `counts` (C, h, w) at map columns tx (P,) and rows ty (P,)."""
    n_classes, h, w = counts.shape
    cols, rows = tx.astype(np.int64), ty.astype(np.int64)
    keep_c, keep_r = (cols >= 0) & (cols < w), (rows >= 0) & (rows < h)  # past the slide's edge: dropped
    if not keep_c.any() or not keep_r.any():
        return
    c0, r0 = int(cols[keep_c].min()), int(rows[keep_r].min())
    bw, bh = int(cols[keep_c].max()) - c0 + 1, int(rows[keep_r].max()) - r0 + 1
    sub = cls[np.ix_(keep_r, keep_c)]
    local = (sub * bh + (rows[keep_r] - r0)[:, None]) * bw + (cols[keep_c] - c0)[None, :]
    hist = np.bincount(local.ravel(), minlength=n_classes * bh * bw).reshape(n_classes, bh, bw)
    counts[:, r0 : r0 + bh, c0 : c0 + bw] += hist


def model_tissue_mask(slide: Slide, seg: Segmenter, thumb: Thumbnail, params: TileParams) -> np.ndarray:
    """(h, w) bool tissue mask at the thumbnail's size from a tissue network (glass-only windows skipped)."""
    not_glass = min_rgb(thumb.image[None])[0] < params.white_level
    fractions = class_fractions(slide, seg, thumb.image.shape[:2], not_glass | thumb.unknown)
    return fractions[seg.spec.tissue_class] > 0.5


def box_means(maps: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """(N, C) mean of each of the (C, h, w) maps over each (x0, y0, x1, y1) box in map pixels."""
    _, h, w = maps.shape
    table = np.zeros((maps.shape[0], h + 1, w + 1), np.float64)
    table[:, 1:, 1:] = maps.astype(np.float64).cumsum(1).cumsum(2)
    x0 = np.clip(np.floor(boxes[:, 0] + 0.5).astype(np.int64), 0, w)
    y0 = np.clip(np.floor(boxes[:, 1] + 0.5).astype(np.int64), 0, h)
    x1 = np.maximum(np.clip(np.floor(boxes[:, 2] + 0.5).astype(np.int64), 0, w), np.minimum(x0 + 1, w))
    y1 = np.maximum(np.clip(np.floor(boxes[:, 3] + 0.5).astype(np.int64), 0, h), np.minimum(y0 + 1, h))
    inside = table[:, y1, x1] - table[:, y0, x1] - table[:, y1, x0] + table[:, y0, x0]  # (C, N)
    return (inside / np.maximum((x1 - x0) * (y1 - y0), 1)).T


def artifact_verdicts(slide: Slide, seg: Segmenter, found: TissueGrid, max_fraction: float) -> np.ndarray:
    """(M,) int8 per candidate tile: KEPT, or ARTIFACT_BASE + the artifact class covering most of it."""
    h, w = found.mask.shape
    fractions = class_fractions(slide, seg, (h, w), found.mask)
    w0, h0 = slide.dimensions
    sx, sy = w / w0, h / h0
    xy = found.candidate_coords.astype(np.float64)
    step = found.grid.step_px
    boxes = np.stack([xy[:, 0] * sx, xy[:, 1] * sy, (xy[:, 0] + step) * sx, (xy[:, 1] + step) * sy], axis=1)
    classes = sorted(seg.spec.artifact_classes)
    if not len(boxes):
        return np.zeros(0, np.int8)
    share = box_means(fractions[classes], boxes)  # (M, A)
    verdict = np.full(len(boxes), KEPT, np.int8)
    bad = share.sum(axis=1) > max_fraction
    verdict[bad] = ARTIFACT_BASE + np.asarray(classes)[share[bad].argmax(axis=1)]
    return verdict


def artifact_reason_names(seg: Segmenter) -> dict[str, int]:
    """Reason name ("artifact: fold", ...) -> code, for the counts, the QC legend and the tile file."""
    return {f"artifact: {name}": ARTIFACT_BASE + k for k, name in sorted(seg.spec.artifact_classes.items())}


def segmentation_record(
    options: SegmentationOptions, tissue: Segmenter | None, artifact: Segmenter | None, reasons: np.ndarray
) -> SegmentationRecord:
    """For the tile file: the models (name, weights, sha256, mpp) and the tiles each artifact removed."""
    models: SegmentationModels = {}
    if tissue is not None:
        models["tissue"] = tissue.describe()
    if artifact is not None:
        models["artifact"] = {**artifact.describe(), "max_artifact_fraction": options.max_artifact_fraction}
    if artifact is None:
        return SegmentationRecord(models=models)
    counts = {name: int((reasons == code).sum()) for name, code in artifact_reason_names(artifact).items()}
    return SegmentationRecord(models=models, n_artifact=int(sum(counts.values())), artifact_counts=counts)


class ModelIdentity(TypedDict, total=False):
    """What decides whether a tile file's segmentation is this run's: (name, sha256[, max fraction])."""

    tissue: tuple[str, str]
    artifact: tuple[str, str, float | None]


def wanted_models(options: SegmentationOptions | None) -> ModelIdentity:
    """What a run with `options` records, without loading anything (sha256 of the files as they are)."""
    if options is None or not options.active:
        return {}
    out: ModelIdentity = {}
    if options.tissue_model and options.tissue_weights:
        out["tissue"] = (options.tissue_model, sha256_file(options.tissue_weights))
    if options.artifact_model and options.artifact_weights:
        out["artifact"] = (
            options.artifact_model,
            sha256_file(options.artifact_weights),
            options.max_artifact_fraction,
        )
    return out


def same_models(meta: TileFileMeta, options: SegmentationOptions | None) -> bool:
    """Whether a finished tile file was made with the models (and weights) of `options`."""
    stored = meta.segmentation_models()
    got: ModelIdentity = {}
    if "tissue" in stored:
        got["tissue"] = (stored["tissue"].get("name", ""), stored["tissue"].get("sha256", ""))
    if "artifact" in stored:
        a = stored["artifact"]
        got["artifact"] = (a.get("name", ""), a.get("sha256", ""), a.get("max_artifact_fraction"))
    return got == wanted_models(options)


__all__ = [
    "ARTIFACT_BASE",
    "SegmentationOptions",
    "artifact_reason_names",
    "artifact_verdicts",
    "box_means",
    "class_fractions",
    "model_tissue_mask",
    "same_models",
    "segmentation_record",
    "segmenters",
]

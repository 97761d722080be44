"""`wsi tile --review FILE|FOLDER`: a reviewer's verdicts over the filters', from a QuPath export of
qc/<slide_id>.geojson, applied to the candidates the tile file stores: a new or changed review reads no
slide pixels (with --save-tiles, only those of the tiles it newly keeps).

Rules, per candidate tile (matched by its box to the file's tile objects, `wsi.formats.qupath.review`):
- a tile object classed "kept" (any case) keeps the tile; any other class drops it (our fates:
  background, blurry, ink, ...; Ignore*, Exclude, or a class of the user's own);
- an annotation classed Exclude, Excluded or Ignore* (`wsi.formats.qupath.is_excluded`) drops every tile whose
  centre lies inside it, whatever the tile's class (the --roi rule);
- a candidate the file does not hold (deleted in QuPath, or an export of selected objects or of drawn
  regions only) and an unclassified tile object keep the filters' verdict; other annotations (the tissue
  outline) are ignored.
Refused for the slide, naming the file (its old output left as it was): tile objects that are no
candidate of this slide (another slide's file, or other tile settings), one tile with two verdicts
(objects imported twice), keeping a tile whose pixels could not be decoded, our own file of another id.

The tile file stores every candidate with the filters' verdict (`wsi.formats.tile_file.Candidates`) and the
review's file, sha256 and counts (`wsi.formats.tile_meta.ReviewRecord`); its counts are the final fates (a
reviewer's drop counts as `n_excluded`). The QC picture and qc/<id>.geojson keep the filters' verdicts,
so the file a reviewer edits is the same whatever review was applied: a review applied again is a no-op,
and a run without --review goes back to the filters' verdicts, also without reading the slide.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wsi.core.errors import ConfigError, ReviewError
from wsi.core.files import check_regular_file, is_regular_file, sha256_file
from wsi.formats.qupath import ReviewFile, read_review
from wsi.formats.qupath.read import inside_any
from wsi.formats.tile_file import Candidates, TileFile, open_tile_pixels, read_candidates, write_tile_file
from wsi.formats.tile_meta import ReviewRecord, TileFileMeta
from wsi.pipelines.tile.artifacts import artifact_counts_by_name, count_reasons
from wsi.pipelines.tile.findings import TileSlideResult, low_yield, upsampling_note
from wsi.pipelines.tile.output import pixel_writer
from wsi.pipelines.tile.read import read_tile_chunks
from wsi.slides.slide import Slide, open_slide
from wsi.tiling.grid import EXCLUDED, KEPT, UNREADABLE
from wsi.tiling.params import TileParams

if TYPE_CHECKING:
    from wsi.pipelines.tile.job import TileJob, TileOutputs
    from wsi.slides.sources import SlideSource

log = logging.getLogger(__name__)

#: the class that keeps a tile (what qc/<id>.geojson calls a kept tile)
KEPT_CLASS = "kept"
#: a review's verdict on one candidate
NO_SAY, DROP, KEEP = -1, 0, 1
#: level-0 px a tile object's corner may be off the grid (QuPath writes 2 decimals; we round to 2)
_TOLERANCE_PX = 0.5
#: files of a review folder, by preference (QuPath's export may be compressed)
_SUFFIXES = (".geojson", ".json", ".geojson.gz", ".zip")


def review_file_for(review: Path | None, slide_id: str) -> Path | None:
    """A slide's review file: `review` itself, or <review>/<slide_id>.geojson (.json, .geojson.gz, .zip)
    when it is a folder; None without --review or when the folder has none for this slide (the slide
    keeps the filters' verdict, and `check_review_option` names the folder's files of no slide)."""
    if review is None:
        return None
    if not review.is_dir():
        return review
    return next(
        (f for s in _SUFFIXES if is_regular_file(f := review / f"{slide_id}{s}", "--review file")), None
    )


def review_digest(review: Path | None, slide_id: str) -> str:
    """sha256 of the slide's review file ("" when it has none); a finished slide whose stored digest
    differs has the review applied again (from its tile file)."""
    path = review_file_for(review, slide_id)
    if path is None:
        return ""
    try:
        return sha256_file(path)
    except OSError:
        return "missing"


def check_review_option(review: Path | None, out_dir: Path, slide_ids: Sequence[str]) -> None:
    """ConfigError before any slide runs for a --review the run cannot use; a warning for a folder's
    review files that match no slide of the run (a misspelt id would else be ignored)."""
    if review is None:
        return
    if not review.exists():
        raise ConfigError(
            f"--review {review} does not exist; give a QuPath GeoJSON export or a folder of them"
        )
    qc = (out_dir / "qc").resolve()
    if review.resolve() == qc or qc in review.resolve().parents:
        raise ConfigError(
            f"--review {review} is inside this run's qc/ folder, which every re-tiled slide rewrites: export "
            "the reviewed objects from QuPath to another folder and pass that"
        )
    if review.is_file() and len(slide_ids) > 1:
        raise ConfigError(
            f"--review {review} is one file for {len(slide_ids)} slides: give a folder of <slide_id>.geojson"
        )
    if not review.is_dir():
        check_regular_file(review, "--review")  # a pipe would be read twice (digest, then content)
    if review.is_dir():
        ids = set(slide_ids)
        named = [f for f in review.iterdir() if f.name.endswith(_SUFFIXES)]
        files = [f for f in named if is_regular_file(f, "--review file")]  # a pipe or device: refused
        stray = sorted(f.name for f in files if _stem(f) not in ids)
        if stray:
            log.warning(
                "--review %s: %d file(s) match no slide of this run and are not used: %s", review, len(stray),
                ", ".join(stray[:5]) + (" ..." if len(stray) > 5 else ""),
            )  # fmt: skip


def _stem(path: Path) -> str:
    name = path.name
    return next((name[: -len(s)] for s in _SUFFIXES if name.endswith(s)), name)


def load_review(review: Path | None, slide_id: str) -> ReviewFile | None:
    """The slide's review (None when it has none); ReviewError for an unusable file."""
    path = review_file_for(review, slide_id)
    if path is None:
        return None
    found = read_review(path)
    if found.slide_id is not None and found.slide_id != slide_id:
        raise ReviewError(
            f"--review {path} is the QC file of slide {found.slide_id!r}, not of {slide_id!r}: pass this "
            "slide's own (edited) qc file"
        )
    return found


def review_verdicts(review: ReviewFile, coords: np.ndarray, step_px: float) -> np.ndarray:
    """(M,) int8 KEEP / DROP / NO_SAY per candidate (`coords` (M, 2) level-0 top-left) by the rules of
    the module docstring; ReviewError when the file's tiles are not this slide's candidates."""
    where = f"--review {review.path}"
    verdict = np.full(len(coords), NO_SAY, np.int8)
    boxes = review.boxes
    if len(boxes):
        sizes = boxes[:, 2:] - boxes[:, :2]
        wrong = np.flatnonzero((np.abs(sizes - step_px) > 2 * _TOLERANCE_PX).any(axis=1))
        if len(wrong):
            w, h = sizes[wrong[0]]
            raise ReviewError(
                f"{where}: {len(wrong)} tile object(s) are not tiles of this run ({w:g} x {h:g} px; this "
                f"run's tiles are {step_px:.6g} px a side): made with other --tile-um / --mpp, or another "
                "slide's file"
            )
        index = {(int(x), int(y)): i for i, (x, y) in enumerate(np.asarray(coords, dtype=np.int64))}
        corners = np.rint(boxes[:, :2]).astype(np.int64)
        off = np.abs(boxes[:, :2] - corners).max(axis=1) > _TOLERANCE_PX
        found = np.array(
            [-1 if o else index.get((int(x), int(y)), -1) for (x, y), o in zip(corners, off, strict=True)]
        )
        missing = np.flatnonzero(found < 0)
        if len(missing):
            x, y = boxes[missing[0], :2]
            raise ReviewError(
                f"{where}: {len(missing)} of its {len(boxes)} tile objects are not candidate tiles of "
                f"this slide (first at x={x:g}, y={y:g} level-0 px): it is another slide's file, or the "
                "tiles were made with other settings (--tile-um, --mpp, --min-tissue, --roi); review this "
                "slide's own qc/<slide_id>.geojson"
            )
        says = np.array([_verdict(c) for c in review.classes], dtype=np.int8)
        for i, v in zip(found, says, strict=True):
            if v == NO_SAY:
                continue
            if verdict[i] not in (NO_SAY, v):
                x, y = coords[i]
                raise ReviewError(
                    f"{where}: the tile at x={x}, y={y} is there twice, classed to keep and to drop (objects "
                    "imported twice into QuPath?); delete one copy and export again"
                )
            verdict[i] = v
    if review.exclude and len(coords):
        centres = np.asarray(coords, dtype=np.float64) + step_px / 2
        verdict[inside_any(review.exclude, centres)] = DROP
    return verdict


def _verdict(name: str | None) -> int:
    if name is None:
        return NO_SAY
    return KEEP if name.strip().lower() == KEPT_CLASS else DROP


def apply_review(
    reasons: np.ndarray, review: ReviewFile, coords: np.ndarray, step_px: float
) -> tuple[np.ndarray, ReviewRecord]:
    """The final (M,) reason codes (KEPT, the filters' code, or EXCLUDED) and the tile file's record."""
    verdict = review_verdicts(review, coords, step_px)
    bad = np.flatnonzero((verdict == KEEP) & (reasons == UNREADABLE))
    if len(bad):
        where = ", ".join(f"x={x} y={y}" for x, y in coords[bad[:3]])
        raise ReviewError(
            f"--review {review.path} keeps {len(bad)} tile(s) whose pixels could not be decoded ({where}): "
            "they cannot be embedded; class them otherwise"
        )
    final = reasons.copy()
    final[verdict == KEEP] = KEPT
    final[(verdict == DROP) & (reasons == KEPT)] = EXCLUDED
    record = ReviewRecord(
        path=str(review.path),
        sha256=review.sha256,
        n_tiles=len(review.boxes),
        n_regions=len(review.exclude),
        n_restored=int(((final == KEPT) & (reasons != KEPT)).sum()),
        n_dropped=int(((final != KEPT) & (reasons == KEPT)).sum()),
    )
    return final, record


@dataclass(frozen=True)
class TilePixels:
    """The kept tiles' pixel store (--save-tiles): whether to keep one, which candidates it holds now
    (None: no store) and how to read more; only a review that changes the kept set touches it."""

    save: bool
    held: np.ndarray | None
    opener: Callable[[], AbstractContextManager[Slide]]
    threads: int = 1


def write_tiles(
    paths: TileOutputs,
    meta: TileFileMeta,
    candidates: Candidates,
    review: ReviewFile | None,
    *,
    params: TileParams,
    pixels: TilePixels,
) -> TileFileMeta:
    """Write the tile file (last: "done") of the candidates' final fates, the review applied; returns
    its record. `meta`: the filters' record (counts, notes) to update; pixels.held: (M,) bool, the
    candidates whose pixels paths.zarr holds now; pixels.opener: the slide, opened only to read tiles
    the review newly keeps with --save-tiles."""
    filters = candidates.reasons
    final, record = (filters, None) if review is None else apply_review(
        filters, review, candidates.coords, meta.tile_um / meta.mpp
    )  # fmt: skip
    final_meta = _final_meta(meta, candidates, final, record, params)
    held, save_tiles = pixels.held, pixels.save
    kept = final == KEPT
    changed = held is None or not np.array_equal(held, kept)
    if save_tiles and changed:
        _rebuild_pixels(paths, params, meta.slide_id, candidates.coords, kept, pixels)
    elif changed and paths.zarr.exists():
        paths.h5.unlink(missing_ok=True)  # first: a tile file beside pixels of another tile set is never left
        shutil.rmtree(paths.zarr, ignore_errors=True)
    write_tile_file(
        paths.h5, coords=candidates.coords[kept], coords_um=candidates.coords_um[kept], meta=final_meta,
        candidates=candidates,
    )  # fmt: skip
    return final_meta


def _final_meta(
    meta: TileFileMeta, candidates: Candidates, final: np.ndarray, record: ReviewRecord | None,
    params: TileParams,
) -> TileFileMeta:  # fmt: skip
    """The filters' record updated to the final fates: counts, the artifact network's share, the
    low-yield note and why nothing was kept (the review, when it dropped every tile the filters kept)."""
    filters = candidates.reasons
    counts = count_reasons(meta.counts.n_grid, final)
    model = {n: int((final == c).sum()) for c, n in candidates.names.items() if n.startswith("artifact: ")}
    seg = meta.segmentation
    max_artifact = None
    if seg is not None and seg.artifact_counts is not None:
        seg = replace(seg, artifact_counts=model, n_artifact=sum(model.values()))
        max_artifact = (seg.models.get("artifact") or {}).get("max_artifact_fraction")
    weight_free = {k: v for k, v in artifact_counts_by_name(counts.to_dict()).items() if v}
    finding = low_yield(
        counts, min_blur_variance=params.min_blur_variance, max_background=params.max_background_fraction,
        artifact_counts={**weight_free, **model}, max_artifact=max_artifact,
    )  # fmt: skip
    coarse = upsampling_note(meta.mpp, meta.target_mpp)[1]
    few = "; ".join(part for part in (finding.text(), coarse) if part) if finding else ""
    empty = ""
    if counts.n_kept == 0:
        empty = candidates.empty_reason
        if record is not None and (filters == KEPT).any():
            empty = (
                f"no tile kept: the review {record.path} dropped all {record.n_dropped} tiles the filters "
                "kept; class some tiles kept in QuPath, or run without --review"
            )
    return replace(meta, counts=counts, empty_reason=empty, low_yield=few, review=record, segmentation=seg)


def _rebuild_pixels(
    paths: TileOutputs, params: TileParams, slide_id: str, coords: np.ndarray, kept: np.ndarray,
    pixels: TilePixels,
) -> None:  # fmt: skip
    """paths.zarr with the pixels of the `kept` candidates, in order: copied from the old store where it
    holds them, read from the slide where it does not (the slide is opened only then)."""
    held, opener, threads = pixels.held, pixels.opener, pixels.threads
    old = open_tile_pixels(paths.zarr) if held is not None else None
    position = np.cumsum(held) - 1 if held is not None else None  # candidate -> row of the old store
    new = kept & ~held if held is not None else kept
    if new.any():
        log.info("%s: reading %d newly kept tile(s) from the slide (--save-tiles)", slide_id, int(new.sum()))
    writer = pixel_writer(paths.zarr, params, slide_id, int(kept.sum()))
    try:
        with opener() if new.any() else contextlib.nullcontext() as slide:
            fresh = read_tile_chunks(slide, coords[new], params, threads) if slide is not None else iter(())
            buffer: list[np.ndarray] = []
            for i in np.flatnonzero(kept):
                if held is not None and held[i] and old is not None and position is not None:
                    writer.append(np.asarray(old[int(position[i])])[None])
                    continue
                if not buffer:
                    buffer = list(next(fresh))
                writer.append(buffer.pop(0)[None])
        paths.h5.unlink(missing_ok=True)  # first: a tile file beside pixels of another tile set is never left
        writer.close()
    except BaseException:
        writer.abort()
        raise


def rereview(
    source: SlideSource, job: TileJob, paths: TileOutputs, previous: TileFile
) -> TileSlideResult | None:
    """Apply the slide's (new, changed or removed) review to its finished tile file, without reading the
    slide; None when the file predates stored candidates (the caller tiles the slide again)."""
    candidates = read_candidates(paths.h5)
    if candidates is None:
        log.info("%s: recomputing (the review changed; the tile file predates candidates)", source.slide_id)
        return None
    review = load_review(job.review, source.slide_id)
    kept_before = _rows_in(candidates.coords, previous.coords)
    held = kept_before if not job.save_tiles or paths.zarr.is_dir() else None
    pixels = TilePixels(
        save=job.save_tiles, held=held, threads=job.threads,
        opener=lambda: open_slide(source.path, backend=job.backend, mpp=previous.mpp),
    )  # fmt: skip
    meta = write_tiles(paths, previous.meta, candidates, review, params=job.params, pixels=pixels)
    what = f"review {review.path} applied" if review is not None else "review removed: the filters' verdicts"
    log.info("%s: %s from the tile file (%d tiles kept)", source.slide_id, what, meta.n_kept)
    if meta.n_kept == 0:
        why = str(meta.empty_reason)
        log.warning("%s: %s", source.slide_id, why)
        return TileSlideResult.of(source.slide_id, str(source.path), "empty", meta, n=0, error=why)
    return TileSlideResult.of(source.slide_id, str(source.path), "ok", meta, n=meta.n_kept)


def _rows_in(coords: np.ndarray, subset: np.ndarray) -> np.ndarray:
    """(M,) bool: which rows of `coords` (M, 2) are rows of `subset` (K, 2)."""
    key = coords[:, 0].astype(np.int64) * (1 << 32) + coords[:, 1]
    return np.isin(key, subset[:, 0].astype(np.int64) * (1 << 32) + subset[:, 1])


__all__ = [
    "DROP", "KEEP", "KEPT_CLASS", "NO_SAY", "TilePixels", "apply_review", "check_review_option",
    "load_review", "rereview", "review_digest", "review_file_for", "review_verdicts", "write_tiles",
]  # fmt: skip

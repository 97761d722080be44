"""A slide that keeps few of its tissue tiles is said so, with the filter that removed most and its option;
so is a filter that removes much of a slide's tissue.

    upsampling_note(slide_mpp, target_mpp) -> (factor, note)    # a scan coarser than the tiles
    low_yield_note(counts, params, artifact_counts, max_artifact) -> str   # under LOW_YIELD kept: a note
    heavy_filter_note(counts, artifact_counts, slide_id, ...) -> str       # a filter over HEAVY_FILTER
    artifact_empty(counts, artifact_counts, model, max_artifact) -> str    # why empty, when artifacts won
    row_note(meta) -> str                       # the manifest note of a finished tile file (every path)

The notes go to the manifest's `note` column and the command's summary (`wsi tile`), never only the log:
a slide that keeps 3 of 1,815 tissue tiles is "ok" but not what the user asked for, and neither is one
that loses 11% of its tissue to a filter that took blood and eosin for red ink.

HEAVY_FILTER (5%) is a constant, not an option: it changes no tile, only when the user is asked to look,
and it sits where the two kinds of slide part. The filters are held to at most 1% of ink-free tissue
tiles rejected (issue 29; `benchmarks/artifact_accuracy.py`), so on a clean slide no filter should come
near 5%; a slide past it either carries that much artifact (worth a glance at the QC picture anyway) or
shows a filter misfiring on its tissue, which only the user can tell. Blur counts (blurry tiles are
tissue: out-of-focus bands, or smooth tissue such as fat or mucus judged blurry); background does not
(a background tile is mostly glass by definition, and tissue edges give 10-30% of them on most slides);
undecodable tiles have their own note (`pipelines.tile.checks.damage_note`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from wsi.formats.tile_meta import TileFileMeta
from wsi.pipelines.tile.artifacts import artifact_counts_by_name, artifact_note
from wsi.slides.region import LEVEL_TOLERANCE
from wsi.tiling.grid import TileCounts
from wsi.tiling.params import TileParams

#: a slide keeping under this share of its tissue tiles gets a note
LOW_YIELD = 0.10
#: the note's first words, by which the command's summary finds it
LOW_YIELD_PREFIX = "low yield"
#: one filter removing more than this share of a slide's tissue tiles is named (see the module docstring)
HEAVY_FILTER = 0.05
#: that note's first words, by which the command's summary finds it
HEAVY_FILTER_PREFIX = "check filter"
#: the first words of the review's part of a note
REVIEW_PREFIX = "reviewed ("


def upsampling_note(slide_mpp: float, target_mpp: float) -> tuple[float, str]:
    """(factor, note): how many times each tile is enlarged from the slide's finest level (1.0: not)."""
    factor = slide_mpp / target_mpp
    if factor <= 1.0 + LEVEL_TOLERANCE:
        return 1.0, ""
    return factor, (
        f"scanned at {slide_mpp:.3g} um/px, coarser than the tiles' {target_mpp:.3g} um/px: every tile is "
        f"upsampled {factor:.2g}x (no detail is added; blur is judged at the scan's own resolution)"
    )


def _option(worst: str, params: TileParams, max_artifact: float | None) -> str:
    """The option that controls the filter `worst` (a key of `rejections`)."""
    if worst.startswith("artifact"):
        return f"--max-artifact {max_artifact or 0:g} (raise it) or leave out --artifact-model"
    return {
        "review": "the --review file (tiles it classes other than kept, or inside Exclude regions)",
        "blurry": f"--min-blur-var {params.min_blur_variance:g} (lower it; 0 turns the filter off)",
        "background": f"--max-background {params.max_background_fraction:g} (raise it) or --white-level",
    }.get(worst, "none: the slide file is damaged")


def rejections(counts: TileCounts, artifact_counts: Mapping[str, int]) -> dict[str, int]:
    """Tiles removed per filter: blurry, background, unreadable and each artifact class ("artifact: pen")."""
    out = {"blurry": counts.n_blurry, "background": counts.n_background, "unreadable": counts.n_unreadable}
    out.update({name: int(n) for name, n in artifact_counts.items()})
    if counts.n_excluded:
        out["review"] = counts.n_excluded
    return out


def low_yield_note(
    counts: TileCounts,
    params: TileParams,
    artifact_counts: Mapping[str, int] | None = None,
    max_artifact: float | None = None,
) -> str:
    """A note when a slide keeps some but under LOW_YIELD of its tissue tiles, else ""."""
    if counts.n_tissue == 0 or counts.n_kept == 0 or counts.n_kept >= LOW_YIELD * counts.n_tissue:
        return ""
    removed = rejections(counts, artifact_counts or {})
    worst = max(removed, key=lambda k: removed[k])
    option = _option(worst, params, max_artifact)
    return (
        f"{LOW_YIELD_PREFIX}: kept {counts.n_kept} of {counts.n_tissue} tissue tiles "
        f"({counts.n_kept / counts.n_tissue:.1%}, under {LOW_YIELD:.0%}); most removed as {worst} "
        f"({removed[worst]}); option: {option}"
    )


def heavy_filter_note(
    counts: TileCounts,
    artifact_counts: Mapping[str, int],
    slide_id: str,
    min_blur_variance: float,
    max_artifact: float | None = None,
) -> str:
    """A note naming each filter that removed more than HEAVY_FILTER of the tissue tiles, with its share,
    the QC picture to look at and the option that turns it off ("" when none did). artifact_counts: the
    weight-free filters' ("ink") and the artifact network's ("artifact: pen") tiles."""
    n = counts.n_tissue
    removed = {"blurry": counts.n_blurry, **{name: int(k) for name, k in artifact_counts.items()}}
    heavy = [(name, k) for name, k in removed.items() if n and k > HEAVY_FILTER * n]
    if not heavy:
        return ""
    shares = ", ".join(f"{name} removed {k / n:.1%} ({k} of {n})" for name, k in heavy)
    options = []
    for name, _ in heavy:
        if name == "blurry":
            options.append(f"--min-blur-var {min_blur_variance:g} (lower it; 0 turns the blur filter off)")
        elif name.startswith("artifact"):
            options.append(f"--max-artifact {max_artifact or 0:g} (raise it) or leave out --artifact-model")
        else:
            options.append(f"--no-filter {name}")
    return (
        f"{HEAVY_FILTER_PREFIX}: {shares} of the tissue tiles (over {HEAVY_FILTER:.0%}); look at "
        f"qc/{slide_id}.png, or qc/{slide_id}.geojson in QuPath; if it took tissue: "
        f"{'; '.join(options)}, or re-class tiles in QuPath and pass the export back with --review"
    )


def row_note(meta: TileFileMeta) -> str:
    """The manifest note of a slide from its tile file's record: tiles rejected per artifact, a filter
    over HEAVY_FILTER, the low-yield note, the review applied and what is wrong with the ROI's place ("" when
    there is nothing to say)."""
    counts = meta.counts
    seg = meta.segmentation
    by_name = {k: v for k, v in artifact_counts_by_name(counts.to_dict()).items() if v}
    by_name.update((seg.artifact_counts or {}) if seg is not None else {})
    model = (seg.models.get("artifact") or {}) if seg is not None else {}
    blur_setting = meta.params.get("min_blur_variance")  # the stored TileParams (any version's JSON)
    blur = float(blur_setting) if isinstance(blur_setting, int | float) else 0.0
    heavy = heavy_filter_note(counts, by_name, meta.slide_id, blur, model.get("max_artifact_fraction"))
    review = ""
    if meta.review is not None:
        r = meta.review
        review = (
            f"{REVIEW_PREFIX}{Path(r.path).name}): {r.n_restored} rejected tile(s) kept, {r.n_dropped} kept "
            f"tile(s) dropped ({r.n_tiles} tile objects, {r.n_regions} Exclude region(s))"
        )
    roi = meta.roi.note if meta.roi is not None else ""
    parts = (artifact_note(counts.to_dict()), meta.low_yield, heavy, review, roi)
    return "; ".join(part for part in parts if part)


def note_part(note: str, prefix: str) -> str:
    """The part of a manifest note (`row_note`: parts joined by "; ") that starts with `prefix`, up to
    the next part of another kind ("" when there is none)."""
    if prefix not in note:
        return ""
    rest = note[note.index(prefix) :]
    others = (p for p in (LOW_YIELD_PREFIX, HEAVY_FILTER_PREFIX, REVIEW_PREFIX) if p != prefix)
    ends = [e for p in others if (e := rest.find(f"; {p}")) > 0]
    return rest[: min(ends, default=len(rest))]


def artifact_empty(
    counts: TileCounts, artifact_counts: Mapping[str, int], model: str, max_artifact: float
) -> str:
    """Why a slide kept no tile when the artifact model removed most of them ("" when another filter did)."""
    removed = rejections(counts, artifact_counts)
    worst = max(removed, key=lambda k: removed[k])
    if not worst.startswith("artifact") or counts.n_kept:
        return ""
    n_artifact = sum(artifact_counts.values())
    return (
        f"no tile kept: {n_artifact} of {counts.n_tissue} tissue tiles rejected by the artifact model "
        f"{model}, most as {worst.removeprefix('artifact: ')} ({removed[worst]}): raise --max-artifact "
        f"{max_artifact:g} or leave out --artifact-model"
    )


__all__ = [
    "HEAVY_FILTER",
    "HEAVY_FILTER_PREFIX",
    "LOW_YIELD",
    "LOW_YIELD_PREFIX",
    "REVIEW_PREFIX",
    "artifact_empty",
    "heavy_filter_note",
    "low_yield_note",
    "note_part",
    "rejections",
    "row_note",
    "upsampling_note",
]

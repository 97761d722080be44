"""A slide that keeps few of its tissue tiles is said so, with the filter that removed most and its option.

    upsampling_note(slide_mpp, target_mpp) -> (factor, note)    # a scan coarser than the tiles
    low_yield_note(counts, params, artifact_counts, max_artifact) -> str   # under LOW_YIELD kept: a note
    artifact_empty(counts, artifact_counts, model, max_artifact) -> str    # why empty, when artifacts won

The note goes to the manifest's `note` column and the command's summary (`wsi tile`), never only the log:
a slide that keeps 3 of 1,815 tissue tiles is "ok" but not what the user asked for.
"""

from __future__ import annotations

from collections.abc import Mapping

from wsi.region import LEVEL_TOLERANCE
from wsi.tile_params import TileParams
from wsi.tiling import TileCounts

#: a slide keeping under this share of its tissue tiles gets a note
LOW_YIELD = 0.10
#: the note's first words, by which the command's summary finds it
LOW_YIELD_PREFIX = "low yield"


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
        "blurry": f"--min-blur-var {params.min_blur_variance:g} (lower it; 0 turns the filter off)",
        "background": f"--max-background {params.max_background_fraction:g} (raise it) or --white-level",
    }.get(worst, "none: the slide file is damaged")


def rejections(counts: TileCounts, artifact_counts: Mapping[str, int]) -> dict[str, int]:
    """Tiles removed per filter: blurry, background, unreadable and each artifact class ("artifact: pen")."""
    out = {"blurry": counts.n_blurry, "background": counts.n_background, "unreadable": counts.n_unreadable}
    out.update({name: int(n) for name, n in artifact_counts.items()})
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
    "LOW_YIELD",
    "LOW_YIELD_PREFIX",
    "artifact_empty",
    "low_yield_note",
    "rejections",
    "upsampling_note",
]

"""How the tile stage reports the artifact filters (`wsi.tiling.artifacts`): the count of every reason for the
tile file, a note for the manifest row, why an all-artifact slide is empty, and the run's summary line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from wsi.tiling.artifacts import CODES, DESCRIPTIONS, FILTERS
from wsi.tiling.grid import BACKGROUND, BLURRY, EXCLUDED, KEPT, UNREADABLE, TileCounts, TissueGrid


def count_reasons(found: TissueGrid | int, reasons: np.ndarray) -> TileCounts:
    """The tally of one slide's (M,) candidate reason codes (`wsi.tiling.grid.REASON_NAMES`, EXCLUDED);
    `found` may be the grid's number of cells instead (a review re-counts a stored tile file)."""
    return TileCounts(
        n_grid=found if isinstance(found, int) else len(found.grid),
        n_tissue=len(reasons),
        n_background=int(np.count_nonzero(reasons == BACKGROUND)),
        n_blurry=int(np.count_nonzero(reasons == BLURRY)),
        n_unreadable=int(np.count_nonzero(reasons == UNREADABLE)),
        n_kept=int(np.count_nonzero(reasons == KEPT)),
        n_excluded=int(np.count_nonzero(reasons == EXCLUDED)),
        **artifact_counts(reasons),
    )


def artifact_counts(reasons: np.ndarray) -> dict[str, int]:
    """n_<filter> -> tiles rejected as that artifact, from (M,) reason codes."""
    return {f"n_{name}": int(np.count_nonzero(reasons == code)) for name, code in CODES.items()}


def _tally(counts: Mapping[str, Any]) -> list[tuple[str, int]]:
    return [(name, int(counts.get(f"n_{name}", 0) or 0)) for name in FILTERS if counts.get(f"n_{name}")]


def artifact_note(counts: Mapping[str, Any]) -> str:
    """The manifest note of a slide with tiles rejected as artifacts ("" when none), e.g.
    "rejected as artifacts: 12 ink, 3 fold"; `counts` holds n_ink, n_fold, ... (a tile file's meta)."""
    tally = _tally(counts)
    if not tally:
        return ""
    return "rejected as artifacts: " + ", ".join(f"{n} {name}" for name, n in tally)


def artifact_counts_by_name(counts: Mapping[str, Any]) -> dict[str, int]:
    """filter name -> tiles it rejected, from n_ink, n_fold, ... (0 where absent)."""
    return {name: int(counts.get(f"n_{name}", 0) or 0) for name in FILTERS}


def why_artifact(name: str, head: str) -> str:
    """Why an empty slide lost its tiles when the artifact filter `name` took most of them."""
    return (
        f"{head}; most as {name} ({DESCRIPTIONS[name]}): check the slide, or --no-filter {name} "
        "turns the filter off"
    )


def artifact_summary(counts: Sequence[TileCounts]) -> str:
    """One line over a run's slides (their tile counts): tiles rejected per artifact and in how many
    slides ("" if none)."""
    tiles = dict.fromkeys(FILTERS, 0)
    slides = dict.fromkeys(FILTERS, 0)
    for c in counts:
        for name, n in _tally(c.to_dict()):
            tiles[name] += n
            slides[name] += 1
    parts = [
        f"{tiles[name]} {name} ({slides[name]} slide{'s' if slides[name] != 1 else ''})"
        for name in FILTERS
        if tiles[name]
    ]
    if not parts:
        return ""
    return "tiles rejected as artifacts: " + ", ".join(parts) + " (--no-filter NAME turns one off)"

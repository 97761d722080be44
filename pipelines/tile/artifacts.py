"""How the tile stage reports the artifact filters (`wsi.tiling.artifacts`): the count of every reason for the
tile file, a note for the manifest row, why an all-artifact slide is empty, and the run's summary line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from wsi.tiling.artifacts import CODES, DESCRIPTIONS, FILTERS, INK, INK_COLOURS
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


#: colour code -> name, as `candidate_ink_colours` stores them (`wsi.tiling.artifacts.colour_code`)
COLOUR_NAMES = {i: name for i, name in enumerate(INK_COLOURS, 1)}


def ink_colour_counts(reasons: np.ndarray, colours: np.ndarray | None) -> dict[str, int] | None:
    """Colour -> tiles rejected as ink of that colour (most of their ink), from (M,) reason codes and
    (M,) colour codes ("unknown" where no colour was named); None when no colours were recorded."""
    if colours is None:
        return None
    ink = reasons == INK
    out = {name: int(np.count_nonzero(ink & (colours == code))) for code, name in COLOUR_NAMES.items()}
    out["unknown"] = int(np.count_nonzero(ink & (colours == 0)))
    return {name: n for name, n in out.items() if n}


def _tally(counts: Mapping[str, Any]) -> list[tuple[str, int]]:
    return [(name, int(counts.get(f"n_{name}", 0) or 0)) for name in FILTERS if counts.get(f"n_{name}")]


def artifact_note(counts: Mapping[str, Any], ink_colours: Mapping[str, int] | None = None) -> str:
    """The manifest note of a slide with tiles rejected as artifacts ("" when none), e.g.
    "rejected as artifacts: 12 ink (8 red, 4 brown), 3 fold"; `counts` holds n_ink, n_fold, ... (a tile
    file's meta), `ink_colours` the ink tiles per marker colour (`ink_colour_counts`)."""
    tally = _tally(counts)
    if not tally:
        return ""
    return "rejected as artifacts: " + ", ".join(
        f"{n} {name}{ink_colour_text(ink_colours) if name == 'ink' else ''}" for name, n in tally
    )


def ink_colour_text(ink_colours: Mapping[str, int] | None) -> str:
    """" (8 red, 4 brown)": the ink tiles per colour, most first ("" when not recorded)."""
    if not ink_colours:
        return ""
    return " (" + ", ".join(f"{n} {c}" for c, n in sorted(ink_colours.items(), key=lambda kv: -kv[1])) + ")"


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

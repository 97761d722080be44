"""Reason codes of the artifact filters and how a tile's shares become one verdict.

The codes continue `wsi.tiling.grid`'s (KEPT 0, BACKGROUND 1, BLURRY 2, UNREADABLE 3); a tile file and the
QC picture name them by `REASON_NAMES`. A tile rejected as background or unreadable keeps that reason;
an artifact wins over blurry (a fold or a bubble rim is often out of focus: the artifact is the cause).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from wsi.tiling.artifacts.colour import ink_sample, sample_ink_share
from wsi.tiling.params import ARTIFACT_FILTERS as FILTERS
from wsi.tiling.params import ArtifactParams

INK, FOLD, BUBBLE, BORDER, DUST = 4, 5, 6, 7, 8
#: filter name -> reason code, in the order a tile with several artifacts is named
CODES = {"ink": INK, "fold": FOLD, "bubble": BUBBLE, "border": BORDER, "dust": DUST}
assert tuple(CODES) == FILTERS


def artifact_verdicts(
    shares: Mapping[str, np.ndarray], params: ArtifactParams, *, tissue: np.ndarray | None = None
) -> np.ndarray:
    """(N,) reason code per tile (0 where no artifact) from each filter's (N,) share of the tile.

    tissue: each tile's tissue share on the thumbnail; a tile is dust when more than half of its
    tissue is dust islands (a dust speck is a small part of any tile, so a share of the tile would
    never reach a threshold)."""
    n = len(next(iter(shares.values()))) if shares else 0
    limits = {
        "ink": params.max_ink_fraction,
        "fold": params.max_fold_fraction,
        "bubble": params.max_bubble_fraction,
        "border": params.max_border_fraction,
    }
    out = np.zeros(n, np.int8)
    for name in reversed(FILTERS):  # the first filter in FILTERS is written last and wins
        if name not in shares:
            continue
        share = shares[name]
        if name == "dust":
            hit = share > 0.5 * (tissue if tissue is not None else np.ones(n)) if n else np.zeros(0, bool)
            hit &= share > 0
        else:
            hit = share > limits[name]
        out[hit] = CODES[name]
    return out


def judge_tiles(
    tiles: np.ndarray,
    reasons: np.ndarray,
    region_codes: np.ndarray,
    params: ArtifactParams,
    *,
    open_: np.ndarray,
) -> np.ndarray:
    """`reasons` ((B,) int8, changed in place and returned) with artifacts named for the tiles in
    `open_` ((B,) bool: those still kept or only blurry): INK when more than max_ink_fraction of the
    tile's own pixels is ink, else the code of its thumbnail regions (`region_codes`, (B,), 0: none).
    The tile's pixels catch ink the thumbnail smooths away (a thin stroke across one tile)."""
    index = np.flatnonzero(open_)
    if len(index) == 0:
        return reasons
    codes = region_codes[index].copy()
    if params.on("ink"):
        share = sample_ink_share(ink_sample(tiles)[index], params)  # sampled before the tiles are picked
        codes[share > params.max_ink_fraction] = INK
    hit = codes > 0
    reasons[index[hit]] = codes[hit]
    return reasons

"""What the tile stage refuses or warns about besides its filters: slide ids, mpp, slides that kept nothing.

Each check turns a silent wrong result into a message that names the slide, the files and the option
that fixes it:

- `refuse_id_clashes(sources, out_dir)`: ids that are not safe file names, and ids equal, or equal but for
  case, to an earlier slide's in the same batch or to another slide's already in `out_dir` (macOS and
  Windows keep one file for `Slide1.h5` and `slide1.h5`): the later slide is refused, the batch goes on.
- `check_same_slide(...)`: an id whose tile file in `out_dir` was made from another slide file.
- `mpp_disagreement(...)`: a given mpp more than 2x from the slide's metadata.
- `explain_empty(...)`: why a slide kept no tile, naming the filter and the option that controls it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wsi.background import Background, looks_dark_maybe
from wsi.errors import SlideIdError
from wsi.files import sanitize_slide_id
from wsi.sources import SlideSource
from wsi.tiling import TileCounts, TileParams

#: a given mpp further than this factor from the slide's metadata is most likely a typo or a wrong unit
MPP_RATIO_WARN = 2.0


def check_usable_id(slide_id: str) -> None:
    """SlideIdError unless `slide_id` is already a safe file name (what `sanitize_slide_id` leaves alone)."""
    try:
        safe = sanitize_slide_id(slide_id)
    except SlideIdError as exc:
        raise SlideIdError(f"unusable slide id: {exc}") from None
    if safe != slide_id:
        raise SlideIdError(
            f"slide id {slide_id!r} is not a safe file name (a safe spelling is {safe!r}); "
            "give a slide_id made of letters, digits, '.', '_' and '-'"
        )


def refuse_id_clashes(sources: Sequence[SlideSource], out_dir: Path) -> dict[int, str]:
    """Index of each refused source -> the reason. The first slide of an id (by case-folded id) keeps it;
    a later one with the same id, or one differing only by case, is refused naming both files. So is a
    slide whose id differs only by case from a tile file already in `out_dir/tiles`."""
    refused: dict[int, str] = {}
    first: dict[str, SlideSource] = {}
    existing = _existing_ids(out_dir / "tiles")
    for i, src in enumerate(sources):
        try:
            check_usable_id(src.slide_id)
        except SlideIdError as exc:
            refused[i] = f"{src.path}: {exc}"
            continue
        key = src.slide_id.casefold()
        seen = first.setdefault(key, src)
        if seen is not src:
            same = "the same slide id as"
            if seen.slide_id != src.slide_id:
                same = "a slide id differing only by case from"
            refused[i] = (
                f"{src.path} has {same} {seen.path} ({src.slide_id!r} vs {seen.slide_id!r}); on macOS and "
                "Windows their outputs would be one file, so this one is skipped: give it another slide_id "
                "in a CSV slide list or rename the file"
            )
            continue
        other = existing.get(key)
        if other is not None and other != src.slide_id:
            refused[i] = (
                f"{src.path}: slide id {src.slide_id!r} differs only by case from {other!r}, whose tiles "
                f"are already in {out_dir / 'tiles'}; on macOS and Windows they would be one file: give it "
                "another slide_id in a CSV slide list, rename the file, or use another --out"
            )
    return refused


def _existing_ids(tiles_dir: Path) -> dict[str, str]:
    """Case-folded id -> id of every tile file in `tiles_dir` (none when it does not exist)."""
    try:
        return {p.stem.casefold(): p.stem for p in tiles_dir.glob("*.h5") if not p.name.startswith(".")}
    except OSError:
        return {}


def check_same_slide(source: SlideSource, meta: dict[str, Any], tile_file: Path, *, overwrite: bool) -> bool:
    """Whether the finished tile file of this id was made from another slide file whose fate is unknown.

    Raises SlideIdError (the slide fails, its old output stays) when the other file still exists and is
    not this one: two slides share the id. Returns True when the old file is gone (the slide was likely
    moved; the caller compares its size before replacing the tiles), False when nothing is in the way.
    """
    old = str(meta.get("slide_path", ""))
    if overwrite or not old or old == str(source.path):
        return False
    if Path(old).exists():
        try:
            if os.path.samefile(old, source.path):
                return False  # one file reached by two paths (a link, another mount)
        except OSError:
            pass
        raise SlideIdError(same_id_message(source, meta, tile_file))
    return True


def same_id_message(source: SlideSource, meta: dict[str, Any], tile_file: Path) -> str:
    """Why a slide is refused: its id is taken in --out by the tiles of another slide file."""
    old = str(meta.get("slide_path", ""))
    return (
        f"slide id {source.slide_id!r} is already taken in {tile_file.parent.parent} by another slide: "
        f"{tile_file.name} was made from {old}, this slide is {source.path}. Nothing was replaced; give this "
        "slide another slide_id (CSV slide list), use another --out, or --overwrite to replace the old tiles"
    )


def mpp_disagreement(given: float, metadata: float | None, where: str) -> str:
    """A warning when `given` (from `where`) and the slide's metadata mpp are more than 2x apart, else ""."""
    if metadata is None or not metadata > 0 or not given > 0:
        return ""
    ratio = max(given / metadata, metadata / given)
    if ratio <= MPP_RATIO_WARN:
        return ""
    size = "smaller" if given > metadata else "larger"
    return (
        f"{where} gives mpp {given:g} um/px but the slide's metadata says {metadata:g} ({ratio:.1f}x apart): "
        f"tiles would cover {ratio:.1f}x {size} a side of real tissue than asked; check the value (um per "
        "pixel, e.g. 0.25 for 40x, 0.5 for 20x)"
    )


def ignored_fallback_mpp(fallback: float, metadata: float) -> str:
    """A warning when --mpp (used only for slides without metadata) is more than 2x from this slide's."""
    if not mpp_disagreement(fallback, metadata, "--mpp"):
        return ""
    return (
        f"--mpp {fallback:g} is not used for this slide: its metadata says {metadata:g} um/px "
        f"({max(fallback / metadata, metadata / fallback):.1f}x apart). --mpp serves only slides without an "
        "mpp in their metadata; to override the metadata give an `mpp` column in a CSV slide list"
    )


def explain_empty(
    counts: TileCounts,
    params: TileParams,
    *,
    tissue_found: bool,
    background: Background,
    size_um: tuple[float, float],
) -> str:
    """Why a slide kept no tile: the filter that rejected most of its tissue tiles and the option for it."""
    text = _why_empty(counts, params, tissue_found=tissue_found, dark=background.dark, size_um=size_um)
    if looks_dark_maybe(background) and counts.n_grid:
        text += (
            "; the slide shows almost no white glass: if it is a fluorescence or other dark-background "
            "scan, try --background dark"
        )
    return text


def _why_empty(
    counts: TileCounts, params: TileParams, *, tissue_found: bool, dark: bool, size_um: tuple[float, float]
) -> str:
    if counts.n_grid == 0:
        return (
            f"no tile kept: the slide ({size_um[0]:.0f} x {size_um[1]:.0f} um) is smaller than one tile "
            f"(--tile-um {params.tile_um:g}); use a smaller --tile-um"
        )
    if counts.n_tissue == 0:
        if not tissue_found:
            what = (
                f"nothing brighter than its dark background (above {params.tissue.dark_level})"
                if dark
                else f"no pixel more saturated than --min-saturation {params.tissue.min_saturation:g}"
            )
            return (
                f"no tile kept: no tissue found on the thumbnail ({what}): a blank slide, or tissue too "
                "pale for the mask: lower --min-saturation"
            )
        return (
            f"no tile kept: tissue was found, but no {params.tile_um:g} um grid cell is at least "
            f"--min-tissue {params.min_tissue_fraction:g} tissue: lower --min-tissue or --tile-um"
        )
    rejected = {
        "blurry": counts.n_blurry,
        "background": counts.n_background,
        "unreadable": counts.n_unreadable,
    }
    worst = max(rejected, key=lambda k: rejected[k])
    tally = f"{counts.n_blurry} blurry, {counts.n_background} background, {counts.n_unreadable} unreadable"
    head = f"no tile kept: all {counts.n_tissue} tissue tiles rejected ({tally})"
    if worst == "blurry":
        return (
            f"{head}; most as blurry (variance of the Laplacian below --min-blur-var "
            f"{params.min_blur_variance:g}): lower --min-blur-var (0 turns the filter off) or check the focus"
        )
    if worst == "background":
        pixel = (
            f"near-black: brightest channel at most {255 - params.white_level} (255 - --white-level)"
            if dark
            else f"near-white: R, G, B all at least --white-level {params.white_level}"
        )
        return (
            f"{head}; most as background (more than --max-background {params.max_background_fraction:g} "
            f"of their pixels {pixel}): raise --max-background or adjust --white-level"
        )
    return f"{head}; most could not be decoded: the slide file is damaged"

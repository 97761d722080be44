"""What the tile stage refuses or warns about besides its filters: slide ids, mpp, slides that kept nothing.

Each check turns a silent wrong result into a message that names the slide, the files and the option
that fixes it:

- `refuse_id_clashes(sources, out_dir)`: ids that are not safe file names, and ids equal, or equal but for
  case, to an earlier slide's in the same batch or to another slide's already in `out_dir` (macOS and
  Windows keep one file for `Slide1.h5` and `slide1.h5`): the later slide is refused, the batch goes on.
- `check_same_slide(...)`: an id whose tile file in `out_dir` was made from another slide file (a local
  path or a URL); `slide_changed(...)`: the slide file at the same place replaced (its fingerprint, size,
  version and header, differs from the one recorded); `check_unchanged(...)`: replaced while tiled.
- `mpp_disagreement(...)`: a given mpp more than 2x from the slide's metadata.
- `explain_empty(...)`: why a slide kept no tile, naming the filter and the option that controls it.
- `file_damage(...)`, `check_damage(...)`: how much of the file could not be decoded, counted in the
  file's own tiles; a slide fails only when that is beyond `max_unreadable_fraction`
  (`wsi.slides.tiff_tiles.FileDamage.too_much`). Below it the tiles are counted and the places named in one
  warning and the manifest row (`damage_note`), the tile file (`damage_record`) and the QC picture.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wsi.core.errors import SlideError, SlideIdError, WsiError
from wsi.core.files import sanitize_slide_id
from wsi.formats.tile_meta import DamageRecord, TileFileMeta
from wsi.pipelines.tile.artifacts import artifact_counts_by_name, artifact_note, why_artifact
from wsi.slides.sources import SlideSource
from wsi.slides.tiff_tiles import (
    FileDamage,
    FileTileProbe,
    describe_regions,
    distinct_regions,
    file_tile_px,
    file_tiles_under,
)
from wsi.storage.identity import SlideFingerprint, exists, fingerprint, same_file
from wsi.tiling.artifacts import FILTERS
from wsi.tiling.background import Background, looks_dark_maybe
from wsi.tiling.grid import TileCounts, TissueGrid
from wsi.tiling.params import TileParams

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from wsi.formats.tile_file import TileFile
    from wsi.slides.slide import Slide

#: undecodable regions listed in a tile file (`unreadable_regions`); the count says how many in all
MAX_STORED_REGIONS = 1000
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


def check_same_slide(source: SlideSource, meta: TileFileMeta, tile_file: Path, *, overwrite: bool) -> bool:
    """Whether the finished tile file of this id was made from another slide file whose fate is unknown.

    Raises SlideIdError (the slide fails, its old output stays) when the other file still exists and is
    not this one: two slides share the id. Returns True when the old file is gone (the slide was likely
    moved; the caller compares its size before replacing the tiles), False when nothing is in the way.
    """
    old = meta.slide_path
    if overwrite or not old or same_file(old, source.path):  # also one file reached by two paths
        return False
    if exists(old):  # a local path or a URL (`wsi.storage.identity`)
        raise SlideIdError(same_id_message(source, meta, tile_file))
    return True


def slide_changed(meta: TileFileMeta, current: SlideFingerprint | None) -> str:
    """Why the slide file at the recorded place is not the one these tiles were cut from ("" when it is,
    or when either fingerprint is unknown: a tile file from before they were recorded, a slide that
    cannot be looked at, which opening it will report)."""
    if meta.fingerprint is None or current is None:
        return ""
    return meta.fingerprint.differs(current)


def check_unchanged(source: SlideSource, before: SlideFingerprint | None, tile_file: Path) -> None:
    """SlideError (its new tile file removed) when the slide file was replaced while it was being tiled:
    the tiles would mix two files."""
    if before is None:
        return
    try:
        after = fingerprint(source.path, header=False)
    except (OSError, WsiError):
        after = None
    why = "it is gone" if after is None else (
        "" if (after.size, after.version) == (before.size, before.version) else
        f"{before.size} bytes, {before.version} -> {after.size} bytes, {after.version}"
    )  # fmt: skip
    if why:
        tile_file.unlink(missing_ok=True)
        raise SlideError(
            f"{source.path}: the slide file was replaced while it was being tiled ({why}); nothing was kept. "
            "Run the command again once the file stays as it is"
        )


def same_id_message(source: SlideSource, meta: TileFileMeta, tile_file: Path) -> str:
    """Why a slide is refused: its id is taken in --out by the tiles of another slide file."""
    old = meta.slide_path
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
                "nothing brighter than its dark background's noise (by "
                f"{params.tissue.dark_noise_sigmas:g} sigma)"
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
        **artifact_counts_by_name(counts.to_dict()),
    }
    worst = max(rejected, key=lambda k: rejected[k])
    tally = f"{counts.n_blurry} blurry, {counts.n_background} background, {counts.n_unreadable} unreadable"
    if counts.n_artifacts:
        tally += ", " + artifact_note(counts.to_dict()).removeprefix("rejected as artifacts: ")
    head = f"no tile kept: all {counts.n_tissue} tissue tiles rejected ({tally})"
    if worst in FILTERS:
        return why_artifact(worst, head)
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


def file_damage(slide: Slide, found: TissueGrid, probe: FileTileProbe) -> FileDamage:
    """What the tile reads found undecodable (`probe`), against the stored tiles under the tissue tiles
    at the level they are read from."""
    coords = found.candidate_coords.astype(np.float64)  # (M, 2) level-0 top-left
    boxes = np.concatenate([coords, coords + found.grid.step_px], axis=1)  # (M, 4) x0, y0, x1, y1
    regions = probe.regions
    return FileDamage(
        n_bad=len(regions), n_tissue=file_tiles_under(slide, probe.level, boxes), level=probe.level,
        tile_px=file_tile_px(slide, probe.level), regions=regions,
    )  # fmt: skip


def check_damage(path: Path | str, counts: TileCounts, damage: FileDamage, params: TileParams) -> None:
    """SlideError when the file is damaged beyond `max_unreadable_fraction` of its tiles under the tissue
    (`FileDamage.too_much`): a slide that is mostly unreadable is an error worth seeing, not a few tiles
    quietly lost."""
    if damage.too_much(params.max_unreadable_fraction):
        raise SlideError(
            f"{path}: the file is damaged: {damage.describe()}, more than max_unreadable_fraction="
            f"{params.max_unreadable_fraction:g}; {counts.n_unreadable} of {counts.n_tissue} tissue tiles "
            f"lost. Copy or download the slide again. Bad: {describe_regions(damage.regions)}"
        )


def damage_note(counts: TileCounts, damage: FileDamage | None, found: TissueGrid) -> str:
    """One line on what could not be decoded in a slide that was tiled anyway ("" when all was read):
    for the warning and the manifest row."""
    parts = []
    if damage is not None and counts.n_unreadable:
        lost = f"{counts.n_unreadable} of {counts.n_tissue} tissue tiles"
        parts.append(f"{lost} unreadable, skipped: {damage.describe()}: {describe_regions(damage.regions)}")
    named = {r.key for r in damage.regions} if damage is not None else set()
    others = [r for r in found.unreadable if r.key not in named]  # the tiles' own findings say the rest
    if others:
        parts.append(
            f"{len(others)} region(s) of the tissue thumbnail could not be decoded (marked unknown, their "
            f"tiles tried): {describe_regions(others)}"
        )
    return "; ".join(parts)


def damage_record(found: TissueGrid, damage: FileDamage | None) -> DamageRecord:
    """What could not be decoded, for the tile file: the tissue thumbnail's undecodable regions, the bad
    stored tiles against those under the tissue, and every region [x, y, w, h, level] in level-0 px."""
    regions = distinct_regions(found.unreadable, damage.regions if damage else ())
    return DamageRecord(
        n_thumbnail_unreadable=len(found.unreadable),
        n_file_tiles_unreadable=damage.n_bad if damage else 0,
        n_file_tiles_tissue=damage.n_tissue if damage else 0,
        regions=tuple(tuple(r.as_list()) for r in regions[:MAX_STORED_REGIONS]),
    )


def check_moved(
    slide: Slide, source: SlideSource, previous: TileFile, tile_file: Path, current: SlideFingerprint | None
) -> None:
    """The old slide file is gone: replace its tiles only when this slide has its dimensions and, where
    recorded, its file size and header (it moved)."""
    meta = previous.meta
    if (meta.level0_width, meta.level0_height) != tuple(slide.dimensions):
        raise SlideIdError(same_id_message(source, meta, tile_file))
    if meta.fingerprint is not None and current is not None and meta.fingerprint.differs(current, moved=True):
        raise SlideIdError(same_id_message(source, meta, tile_file))
    log.info("%s: recomputing (slide moved from %s, which is gone)", source.slide_id, meta.slide_path)

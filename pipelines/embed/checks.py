"""What the embed stage refuses before it embeds, and what it reports after.

- `refuse_case_clashes(files, bag_folder)`: tile files whose ids differ only by case (Slide1, slide1) would
  write one bag on macOS and Windows: the first keeps its id, the later ones fail naming both files. So
  does a tile file whose id differs only by case from a bag already in the folder.
- `other_slide(job, overwrite=)`: a bag of this id made from another slide file (a local path or a URL)
  than the one now being embedded is refused without --overwrite (naming both files), never silently
  replaced or skipped.
- `other_encoder(bag, name, encoder_id, overwrite=)`: a bag made by another encoder under the same id (a
  recipe YAML named like a packaged encoder) is refused without --overwrite, never silently replaced.
- `bad_tiles(results, bag_folder)`: per slide, the tiles left out of its bag because they could not be read.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from wsi.core.errors import WsiError
from wsi.core.files import case_collisions, is_temp_name
from wsi.core.suffixes import BAG_SUFFIX
from wsi.formats.bags import read_bag_attrs
from wsi.models.encoders.recipe import is_recipe_path
from wsi.pipelines.embed.work import SlideJob
from wsi.pipelines.scheduling.results import JobResult
from wsi.storage.identity import SlideFingerprint, exists, same_file

log = logging.getLogger(__name__)


def refuse_case_clashes(files: Sequence[Path], bag_folder: Path) -> dict[Path, str]:
    """Tile file -> why it is refused, for ids equal to an earlier file's or a bag's but for case."""
    refused: dict[Path, str] = {}
    for group in case_collisions(f.stem for f in files).values():
        keep = next(f for f in files if f.stem in group)
        for f in files:
            if f.stem in group and f != keep:
                refused[f] = (
                    f"{f} has a slide id differing only by case from {keep} ({f.stem!r} vs {keep.stem!r}); "
                    "on macOS and Windows their bags would be one file, so this one is skipped: give one "
                    "of the slides another slide_id (CSV slide list) and tile it again"
                )
    try:
        bags = {p.stem.casefold(): p for p in bag_folder.glob(f"*{BAG_SUFFIX}") if not is_temp_name(p)}
    except OSError:
        bags = {}
    for f in files:
        bag = bags.get(f.stem.casefold())
        if f not in refused and bag is not None and bag.stem != f.stem:
            refused[f] = (
                f"{f}: slide id {f.stem!r} differs only by case from the bag {bag}; on macOS and Windows "
                "they would be one file: give the slide another slide_id, or use another --out"
            )
    return refused


def other_encoder(bag: Path, name: str, encoder_id: str, *, overwrite: bool) -> str:
    """Why the bag at `bag` must not be replaced by encoder `name` ("" when nothing is in the way): it holds
    features of another encoder under the same id (an encoder YAML named like a packaged encoder, say).
    Another weights file of the same encoder is a new version of its bags, redone as before."""
    if overwrite or not bag.is_file():
        return ""
    try:
        made = str(read_bag_attrs(bag).get("encoder") or "")
    except WsiError:
        return ""  # unreadable: it is redone, nothing of value is replaced
    if not made or made == name or _same_recipe(made, name):
        return ""
    return (
        f"{bag} holds features of encoder {made!r}; encoder {name!r} has the same id {encoder_id!r} and "
        "would "
        "replace them: give the encoder another name (a recipe's file name is its id) or --overwrite to "
        "replace them"
    )


def _same_recipe(a: str, b: str) -> bool:
    if not (is_recipe_path(a) and is_recipe_path(b)):
        return False
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def other_slide(job: SlideJob, *, overwrite: bool) -> str:
    """Why the bag at `job.bag_path` must not be replaced by this job ("" when nothing is in the way).

    The bag's provenance names the slide it was made from. Another slide file that still exists is
    another slide under the same id; one that is gone was probably moved, and counts as the same
    slide when the level-0 size agrees.
    """
    if overwrite or not job.bag_path.is_file():
        return ""
    try:
        attrs = read_bag_attrs(job.bag_path)
    except WsiError:
        return ""  # unreadable: it is redone, nothing of value is replaced
    old, new = str(attrs.get("slide_path") or ""), job.tiles.slide_path
    if not old or same_file(old, new):  # also one file reached by two paths
        return ""
    if not exists(old) and (attrs.get("level0_width"), attrs.get("level0_height")) == tuple(job.level0_size):
        recorded = SlideFingerprint.from_attrs(dict(attrs))
        if recorded is None or job.fingerprint is None or not recorded.differs(job.fingerprint, moved=True):
            log.info("%s: %s is gone; taking %s as the same slide, moved", job.tiles.slide_id, old, new)
            return ""
    return (
        f"slide id {job.tiles.slide_id!r} is already taken in {job.bag_path.parent}: {job.bag_path.name} was "
        f"made from {old}, but the tiles now being embedded ({job.tile_file}) come from {new}. Nothing "
        "was replaced; give this slide another slide_id, use another --out, or --overwrite to replace the bag"
    )


def bad_tiles(results: Sequence[JobResult], bag_folder: Path) -> dict[str, tuple[int, int]]:
    """Slide id -> (tiles left out as unreadable, tiles asked for), for finished bags that left any out."""
    out: dict[str, tuple[int, int]] = {}
    for r in results:
        if r.status not in ("ok", "skipped"):
            continue
        try:
            attrs = read_bag_attrs(bag_folder / f"{r.slide_id}{BAG_SUFFIX}")
        except WsiError:
            continue
        n_bad = int(attrs.get("n_bad_tiles") or 0)
        if n_bad:
            out[r.slide_id] = (n_bad, int(attrs.get("n_tiles_requested") or n_bad + r.n))
    return out


def bad_tile_lines(counts: dict[str, tuple[int, int]]) -> list[str]:
    """One line per slide for the summary: `slide: 3 of 120 tiles unreadable, left out of its bag`."""
    return [f"{sid}: {bad} of {n} tiles unreadable, left out of its bag" for sid, (bad, n) in counts.items()]

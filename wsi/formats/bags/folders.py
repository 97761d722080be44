"""Where the bags are when a folder given as bags holds none: `wsi embed` writes them two levels down
(RUN/features/<encoder>/), and the run folder or its features/ folder is the usual thing given instead."""

from __future__ import annotations

from pathlib import Path

from wsi.core.files import is_temp_name
from wsi.core.suffixes import BAG_SUFFIX
from wsi.formats.tile_file import is_tile_file

#: how far below the folder given bag folders are looked for (RUN/ -> features/<encoder>/)
SEARCH_DEPTH = 2
MAX_NAMED = 5


def bag_folders_below(folder: Path, *, depth: int = SEARCH_DEPTH) -> list[Path]:
    """Folders up to `depth` levels below `folder` that hold bags, nearest and then by name first."""
    found: list[Path] = []
    level = [folder]
    for _ in range(depth):
        level = sorted(p for parent in level for p in _subfolders(parent))
        found += [p for p in level if (first := _first_h5(p)) is not None and not is_tile_file(first)]
    return found


def tile_files_message(folder: Path) -> str | None:
    """Why `folder` cannot be read as bags when it holds `wsi tile`'s tile files (judged by its first
    .h5), else None."""
    first = _first_h5(folder)
    if first is None or not is_tile_file(first):
        return None
    run = folder.parent if folder.name == "tiles" else folder
    return (
        f"{folder} holds tile files (`wsi tile` output: tile positions, no features), not feature bags; "
        f"embed them first (`wsi embed --tiles {run} --out {run}`) and give {run}/features/<encoder>"
    )


def no_bags_message(folder: Path) -> str:
    """`no feature bags in FOLDER`, naming the bag folders below it when there are any."""
    below = bag_folders_below(folder)
    if not below:
        where = "give the folder `wsi embed` wrote, e.g. RUN/features/<encoder>"
        return f"no feature bags (*{BAG_SUFFIX}) in {folder}; {where}"
    names = ", ".join(str(p) for p in below[:MAX_NAMED]) + (", ..." if len(below) > MAX_NAMED else "")
    one = "give it" if len(below) == 1 else "give one of them (one encoder's bags)"
    return f"no feature bags (*{BAG_SUFFIX}) in {folder} itself; bag folders below it: {names}; {one}"


def _first_h5(folder: Path) -> Path | None:
    return next((f for f in sorted(folder.glob(f"*{BAG_SUFFIX}")) if not is_temp_name(f)), None)


def _subfolders(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


__all__ = ["bag_folders_below", "no_bags_message", "tile_files_message"]

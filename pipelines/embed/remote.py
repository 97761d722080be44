"""The embed stage's edges for remote folders: tile files read from a URL, bags written to one.

    local_tiles(tiles_dir) -> (local folder, URL or None)   a remote run's tile files pulled locally
    publisher(mirror) -> publish(path)                      uploads each bag as the writer finishes it
    embed_item_remote(item, *, options, remote, client_root)   a dask job: the bags in this machine's
                                                             mirror, uploaded when written

The client plans in its own mirror of the output folder (the finished bags pulled, so the resume checks
run on them unchanged); a worker, possibly on another machine, writes the bags it makes into its own
mirror and uploads each one (temp key + move: never half visible).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from pathlib import Path

from wsi.core.suffixes import TILE_FILE_SUFFIX
from wsi.pipelines.embed.config import EmbedOptions
from wsi.pipelines.embed.worker import EmbedItem, embed_item
from wsi.pipelines.scheduling.results import JobResult
from wsi.storage import Mirror, Url, location


def local_tiles(tiles_dir: str | os.PathLike[str]) -> tuple[Path, Url | None]:
    """`--tiles` as a local folder: itself, or for a URL (a run folder or its tiles/ folder) this
    machine's mirror with the tile files pulled (only changed ones are downloaded)."""
    where = location(tiles_dir, what="--tiles folder")
    if not isinstance(where, Url):
        return where, None
    mirror = Mirror(where)
    if where.name == "tiles":
        mirror.pull_folder(suffixes=(TILE_FILE_SUFFIX,))
    else:
        mirror.pull_folder("tiles", suffixes=(TILE_FILE_SUFFIX,))
    return mirror.local, mirror.url


def _publish(mirror: Mirror, path: Path) -> None:
    mirror.push([mirror.rel(path)])


def publisher(mirror: Mirror | None) -> Callable[[Path], None] | None:
    """What the writer calls after each bag: its upload (None for a local --out)."""
    return None if mirror is None else functools.partial(_publish, mirror)


def embed_item_remote(item: EmbedItem, *, options: EmbedOptions, remote: str, client_root: str) -> JobResult:
    """`embed_item` with the bags in this machine's mirror of `remote`, each uploaded once written."""
    mirror = Mirror(Url(remote))
    jobs = tuple(
        None
        if job is None
        else dataclasses.replace(job, bag_path=mirror.local / job.bag_path.relative_to(client_root))
        for job in item.work.jobs
    )
    moved = dataclasses.replace(item, work=dataclasses.replace(item.work, jobs=jobs))
    result = embed_item(moved, options=options)
    mirror.push([mirror.rel(job.bag_path) for job in jobs if job is not None], deletions=False)
    return result


__all__ = ["embed_item_remote", "local_tiles", "publisher"]

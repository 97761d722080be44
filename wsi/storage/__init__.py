"""Slides, bags and run folders in object storage (s3://, gs://, https://, any fsspec scheme), read and
written through a thin layer at the stages' edges.

- urls.py      `Url` (a str without credentials), `is_url`, `parse_url`, `redact`
- fs.py        one fsspec filesystem per scheme; storage failures as one clear StorageError
- settings.py  `StorageSettings` from WSI_CACHE_DIR, WSI_CACHE_GB, WSI_BLOCK_MB, WSI_CACHE_BLOCKS
- slides.py    remote slides: tiffslide range reads with a bounded block cache, or a local copy
- cache.py     bounded local copies of remote files (least recently used go first)
- mirror.py    a remote folder through a local one: pull what changed, push atomically (temp key + move)

Public API (what the stages call):
    location(text) -> Path | Url              a local path, or a checked URL (file:// is a path)
    remote_output(out) -> Mirror | None       a remote --out, checked writable before any work
    local_folder(folder, suffixes=()) -> Path a remote input folder pulled into its local mirror
    local_file(path) -> Path                  a remote input file copied to the local cache
    local_view(folder) -> Path                where this machine keeps a folder (its mirror for a URL)
    origin(path) -> str                       the URL a local mirror or copy stands for, else the path
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from wsi.storage.cache import local_copy, origin_of_copy
from wsi.storage.mirror import Mirror, mirror_dir, origin_of_output
from wsi.storage.settings import StorageSettings, storage_settings
from wsi.storage.urls import Url, is_url, join, parse_url, redact


def location(text: str | os.PathLike[str], *, what: str = "location") -> Path | Url:
    """A local path (also for file://...), or the checked remote Url (StorageError for credentials in it)."""
    if isinstance(text, Url):
        return text
    raw = os.fspath(text)
    if is_url(raw):
        return parse_url(raw, what=what)
    if raw.lower().startswith("file://"):
        return Path(unquote(urlsplit(raw).path))
    return Path(raw)


def remote_output(out: str | os.PathLike[str] | None) -> Mirror | None:
    """The Mirror of a remote output folder (checked writable: a missing bucket or refused credentials
    is one StorageError before any work), or None for a local folder."""
    if out is None:
        return None
    where = location(out, what="output folder")
    if not isinstance(where, Url):
        return None
    mirror = Mirror(where)
    mirror.check_writable()  # also: an object at the folder's own key is refused, as a local file is
    return mirror


def is_remote_file(url: Url) -> bool:
    """Whether `url` names an object (a file), not a folder prefix (StorageError when it cannot be asked)."""
    from wsi.storage.fs import filesystem, translated

    fs, path = filesystem(url)
    with translated(url, "looking it up"):
        return bool(fs.isfile(path.rstrip("/")))


def local_view(folder: str | os.PathLike[str]) -> Path:
    """Where this machine keeps `folder`: itself when local, else its mirror (nothing is fetched)."""
    where = location(folder)
    return mirror_dir(where) if isinstance(where, Url) else where


def local_folder(folder: str | os.PathLike[str], *, suffixes: tuple[str, ...] = ()) -> Path:
    """A local folder with the content of `folder`: itself when local, else its mirror, pulled."""
    where = location(folder, what="input folder")
    if not isinstance(where, Url):
        return where
    mirror = Mirror(where)
    mirror.pull_folder(suffixes=suffixes)
    return mirror.local


def local_file(path: str | os.PathLike[str], *, what: str = "input file") -> Path:
    """A local file with the content of `path`: itself when local, else a copy in the local cache."""
    where = location(path, what=what)
    if not isinstance(where, Url):
        return where
    return local_copy(where, why=f"the {what} is read locally")


def origin(path: str | os.PathLike[str]) -> str:
    """What a path stands for, to be recorded in outputs: the URL of a mirror's file or of a cached copy,
    else the resolved local path."""
    if is_url(path):
        return str(path)
    settings = storage_settings()
    local = Path(path).absolute()
    return origin_of_output(local, settings) or origin_of_copy(local, settings) or str(local.resolve())


__all__ = [
    "Mirror", "StorageSettings", "Url", "is_remote_file", "is_url", "join", "local_file", "local_folder",
    "local_view",
    "location", "origin",
    "parse_url", "redact", "remote_output", "storage_settings",
]  # fmt: skip

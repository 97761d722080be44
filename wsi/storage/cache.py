"""Local copies of remote files, for readers that take only a local file (openslide, DICOM series, MRXS).

A copy lives in `<cache>/files/<sha of the URL>/` with an `entry.json` that records each file's remote
version (ETag, generation): a copy is used again only while the remote file is unchanged, and re-fetched
once it changed. The cache is bounded (`WSI_CACHE_GB`): before a copy is made, the least recently used
entries go until it fits, except entries a reader holds open: openslide re-opens its file between reads,
so a slide opened from its copy takes a shared lock on the entry (`held_local_copies`: taken before the
entry lock is let go, released when the slide is closed) and eviction passes over held entries. An entry
being filled is locked too (flock), so two processes (embed readers, dask workers on one machine) copying
the same slide wait for one download instead of making two.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from wsi.core.errors import StorageError
from wsi.core.files import temp_sibling, write_text_atomic
from wsi.storage.entry_locks import ENTRY, entry_locked, entry_unheld, hold_entry, read_entry
from wsi.storage.fs import filesystem, remote_info, translated
from wsi.storage.settings import StorageSettings, storage_settings
from wsi.storage.urls import Url, join

log = logging.getLogger("wsi.storage")

_DATA = "data"


def entry_dir(url: Url, settings: StorageSettings) -> Path:
    return settings.root / "files" / hashlib.sha256(str(url).encode()).hexdigest()[:24]


def local_copy(url: Url, *, why: str, settings: StorageSettings | None = None) -> Path:
    """A local file with the content of the remote file `url` (copied now, or earlier and unchanged)."""
    return local_copies(url.parent, [url.name], why=why, settings=settings)[0]


def local_copies(
    folder: Url, rels: Sequence[str], *, why: str, settings: StorageSettings | None = None
) -> list[Path]:
    """Local files with the content of `folder/rel` for each rel, kept together in one entry (a DICOM
    series, an MRXS index with its data folder), in the order given. `why` says in the log why a copy is
    needed (e.g. "openslide reads local files only")."""
    return _copies(folder, rels, why=why, settings=settings or storage_settings(), hold=False)[0]


def held_local_copies(
    folder: Url, rels: Sequence[str], *, why: str, settings: StorageSettings | None = None
) -> tuple[list[Path], IO[str]]:
    """`local_copies`, with the entry held (as `hold_copy` holds it) from before the entry lock is let go:
    no other process can evict the copy between its check and the caller's first read. Close the
    returned file when the copy is no longer read."""
    paths, hold = _copies(folder, rels, why=why, settings=settings or storage_settings(), hold=True)
    assert hold is not None
    return paths, hold


def _copies(
    folder: Url, rels: Sequence[str], *, why: str, settings: StorageSettings, hold: bool
) -> tuple[list[Path], IO[str] | None]:
    key = join(folder, rels[0])  # the slide file names the entry, also for a group of files
    where = entry_dir(key, settings)
    fs, root = filesystem(folder)
    root = root.rstrip("/")
    with translated(key, "reading it for a local copy"):
        infos = {rel: remote_info(fs, f"{root}/{rel}") for rel in rels}
    data = where / _DATA
    paths = [data / rel for rel in rels]
    with entry_locked(where):
        held = read_entry(where)
        if held.get("files") == {rel: i.version for rel, i in infos.items()} and all(
            p.is_file() for p in paths
        ):
            _touch(where)
            return paths, hold_entry(where) if hold else None
        need = sum(i.size for i in infos.values())
        check_fits(key, need, settings)  # a declared size is a claim: never evict for more than fits
        _make_room(settings, need, keep=where)
        log.info(
            "%s: copying %s (%.1f MB) to the local cache %s: %s", key, "it" if len(rels) == 1 else
            f"{len(rels)} files", need / 1e6, where, why,
        )  # fmt: skip
        shutil.rmtree(data, ignore_errors=True)
        (where / ENTRY).unlink(missing_ok=True)
        with translated(key, "copying it to the local cache"):
            for rel, path in zip(rels, paths, strict=True):
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = temp_sibling(path)
                try:
                    fs.get_file(f"{root}/{rel}", str(tmp))
                    got = tmp.stat().st_size
                    if got != infos[rel].size:  # the server's listing and its bytes disagree
                        raise StorageError(
                            f"{join(folder, rel)}: the server declared {infos[rel].size} bytes but sent "
                            f"{got}; "
                            "the object changed during the copy, or the server misreports it: try again"
                        )
                    os.replace(tmp, path)
                finally:
                    tmp.unlink(missing_ok=True)
        write_text_atomic(where / ENTRY, json.dumps({
            "url": str(key), "files": {rel: i.version for rel, i in infos.items()}, "bytes": need,
        }))  # fmt: skip
        # taken under the entry lock, which eviction needs too: the copy cannot go before it is held
        return paths, hold_entry(where) if hold else None


def _touch(where: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(where / ENTRY)


def _entries(settings: StorageSettings) -> list[tuple[float, int, Path]]:
    """(last use, bytes, folder) of every cache entry, least recently used first."""
    base = settings.root / "files"
    out = []
    for folder in base.iterdir() if base.is_dir() else ():
        try:
            used = (folder / ENTRY).stat().st_mtime
        except OSError:
            used = 0.0
        size = sum(p.stat().st_size for p in (folder / _DATA).rglob("*") if p.is_file())
        out.append((used, size, folder))
    return sorted(out)


def check_fits(url: Url, need: int, settings: StorageSettings) -> None:
    """StorageError, before anything is evicted, when a copy of `need` bytes (as the server declares it)
    cannot fit: larger than the cache limit, or than the free disk plus what eviction could give back."""
    limit = int(settings.cache_gb * 1e9)
    if need > limit:
        raise StorageError(
            f"{url}: the server declares {need / 1e9:.3g} GB, more than the whole local cache may hold "
            f"(WSI_CACHE_GB={settings.cache_gb:g}); nothing was evicted. Raise WSI_CACHE_GB if the size is "
            "real, or read the slide in place (--backend tiffslide)"
        )
    root = settings.root
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    cached = sum(size for _, size, _ in _entries(settings))
    if need > free + cached:
        raise StorageError(
            f"{url}: the server declares {need / 1e9:.3g} GB, more than the disk of {root} can hold "
            f"({free / 1e9:.3g} GB free, {cached / 1e9:.3g} GB in the cache); nothing was evicted. Free "
            "space, point WSI_CACHE_DIR at a larger disk, or read the slide in place (--backend tiffslide)"
        )


def _make_room(settings: StorageSettings, need: int, *, keep: Path) -> None:
    """Remove least recently used entries until `need` more bytes fit under WSI_CACHE_GB."""
    limit = int(settings.cache_gb * 1e9)
    entries = _entries(settings)
    total = sum(size for _, size, folder in entries if folder != keep)
    for _, size, folder in entries:
        if total + need <= limit:
            break
        if folder == keep:
            continue
        with entry_locked(folder, wait=False) as mine, entry_unheld(folder) as free:
            if not (mine and free):  # being filled by another process, or a reader holds it open
                continue
            shutil.rmtree(folder / _DATA, ignore_errors=True)
            (folder / ENTRY).unlink(missing_ok=True)
        total -= size
        log.debug("evicted %s from the local cache (%.1f MB)", folder, size / 1e6)


def hold_copy(path: Path, settings: StorageSettings | None = None) -> IO[str] | None:
    """A shared lock on the cache entry holding `path`, kept while the caller reads the copy (close the
    returned file to release it); None when `path` is not a cache copy."""
    settings = settings or storage_settings()
    try:
        rel = path.absolute().relative_to(settings.root / "files")
    except ValueError:
        return None
    return hold_entry(settings.root / "files" / rel.parts[0])


def origin_of_copy(path: Path, settings: StorageSettings | None = None) -> str | None:
    """The URL a local copy in the cache was made from (None for any other path)."""
    settings = settings or storage_settings()
    try:
        rel = path.absolute().relative_to(settings.root / "files")
    except ValueError:
        return None
    if len(rel.parts) < 3 or rel.parts[1] != _DATA:
        return None
    url = read_entry(settings.root / "files" / rel.parts[0]).get("url")
    if not isinstance(url, str):
        return None
    inside = "/".join(rel.parts[2:])
    return str(join(Url(url).parent, inside))


__all__ = ["entry_dir", "held_local_copies", "hold_copy", "local_copies", "local_copy", "origin_of_copy"]

"""A remote output folder written through a local one: stages write locally (atomically, as always), then
each finished file is uploaded so that no half-written file is ever visible under its final name.

`Mirror(url).local` is a folder in the local cache that stands for `url` on this machine; the stages run
in it unchanged. `pull(rels)` makes the local files equal to the remote ones (downloading only what
changed, by ETag/generation), `push(rels, last=...)` uploads what the stage changed and removes what it
removed. An upload goes to a temporary key beside the final one (`.NAME.tmp-<pid>-<random>`, a name no
reader takes) and is then moved into place: on S3 a server-side copy, which makes the final object
appear whole or not at all, as a rename does on a disk. A stage's "done" file (a tile file, a bag) is
pushed `last`, and when it changed, its old remote copy is removed first: a kill at any moment leaves
the remote folder either with the old complete output, or without it, never with a new file that
claims a slide is done before its other files are there.

What was pulled or pushed is remembered per file (`.wsi-sync/<rel>.json`: the remote version and the
local size and mtime), so a re-run on the same machine downloads nothing that is unchanged, and a local
file made but never uploaded (a run killed between the two) is uploaded by the next push instead of
being made again. The remote folder is the truth: a file removed there is removed here at the next pull.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from wsi.core.errors import StorageError
from wsi.core.files import temp_sibling, write_text_atomic
from wsi.storage.fs import RemoteInfo, filesystem, list_files, remote_info, storage_error, translated
from wsi.storage.settings import StorageSettings, storage_settings
from wsi.storage.urls import Url, join

log = logging.getLogger("wsi.storage")

STATE = ".wsi-sync"
_URL_FILE = "url"
#: in a unit folder (pushed and pulled whole): each file's remote version, written after all of them
UNIT_MARKER = ".wsi-unit.json"


def mirror_dir(url: Url, settings: StorageSettings | None = None) -> Path:
    """This machine's local folder for the remote folder `url`."""
    settings = settings or storage_settings()
    return settings.root / "outputs" / hashlib.sha256(str(url).rstrip("/").encode()).hexdigest()[:24]


class Mirror:
    """A remote folder `url` and the local folder that stands for it on this machine."""

    def __init__(self, url: Url, settings: StorageSettings | None = None) -> None:
        self.url = Url(str(url).rstrip("/"))
        self.local = mirror_dir(self.url, settings)
        self.fs, self.root = filesystem(self.url)
        self.root = self.root.rstrip("/")
        self.local.mkdir(parents=True, exist_ok=True)
        marker = self.local / STATE / _URL_FILE
        if not marker.is_file():
            write_text_atomic(marker, str(self.url))

    def __repr__(self) -> str:
        return f"Mirror({self.url!r} -> {self.local})"

    # ------------------------------------------------------------------------------------------ names
    def rel(self, local: str | os.PathLike[str]) -> str:
        """The path of a local file of the mirror relative to its root (POSIX)."""
        return Path(local).absolute().relative_to(self.local).as_posix()

    def url_of(self, local: str | os.PathLike[str]) -> Url:
        return join(self.url, self.rel(local))

    def _remote(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def _state_path(self, rel: str) -> Path:
        return self.local / STATE / f"{rel}.json"

    def _state(self, rel: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._state_path(rel).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _remember(self, rel: str, version: str) -> None:
        st = (self.local / rel).stat()
        write_text_atomic(
            self._state_path(rel),
            json.dumps({"version": version, "size": st.st_size, "mtime_ns": st.st_mtime_ns}),
        )

    def _forget(self, rel: str) -> None:
        self._state_path(rel).unlink(missing_ok=True)

    def _unchanged(self, rel: str, state: dict[str, Any] | None) -> bool:
        """The local file is the one last pulled or pushed (same size and mtime)."""
        if state is None:
            return False
        try:
            st = (self.local / rel).stat()
        except OSError:
            return False
        return st.st_size == state.get("size") and st.st_mtime_ns == state.get("mtime_ns")

    # ------------------------------------------------------------------------------------------ check
    def check_writable(self) -> None:
        """Write and remove a small object: a missing bucket or refused credentials are one error before
        any work (as `ensure_writable_dir` does for a local --out)."""
        probe = self._remote(f".wsi-write-test-{uuid.uuid4().hex[:12]}")
        with translated(self.url, "writing into the output folder"):
            if self.fs.isfile(self.root):
                raise StorageError(
                    f"{self.url}: exists and is an object (a file), not a folder; give a folder URL for the "
                    "output (a key under which wsi may write), e.g. "
                    f"{self.url.parent}/{self.url.stem or 'run'}-out/"
                )
            self.fs.pipe_file(probe, b"")
            self.fs.rm_file(probe)

    # ------------------------------------------------------------------------------------------- pull
    def _info(self, rel: str) -> RemoteInfo | None:
        try:
            return remote_info(self.fs, self._remote(rel))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise storage_error(exc, join(self.url, rel), "reading the output folder") from None

    def pull(self, rels: Iterable[str], infos: Mapping[str, RemoteInfo | None] | None = None) -> None:
        """Make each local file equal to the remote one (absent there: removed here, unless it was made
        here and never pushed). `infos`: what a listing found (None: not there); else asked per file."""
        for rel in rels:
            info = infos.get(rel) if infos is not None else self._info(rel)
            state = self._state(rel)
            local = self.local / rel
            if info is None:
                if state is not None:  # it was there and is gone: the remote folder is the truth
                    local.unlink(missing_ok=True)
                    self._forget(rel)
                continue
            if state is not None and state.get("version") == info.version and self._unchanged(rel, state):
                continue
            try:
                local.parent.mkdir(parents=True, exist_ok=True)
                tmp = temp_sibling(local)
            except OSError as exc:  # a key that is also a folder prefix (x and x/y), a name too long here
                raise _unmirrorable(join(self.url, rel), exc) from None
            try:
                with translated(join(self.url, rel), "downloading an earlier output"):
                    self.fs.get_file(self._remote(rel), str(tmp))
                os.replace(tmp, local)
            except (IsADirectoryError, NotADirectoryError) as exc:
                raise _unmirrorable(join(self.url, rel), exc) from None
            finally:
                tmp.unlink(missing_ok=True)
            self._remember(rel, info.version)

    def pull_folder(
        self, sub: str = "", *, suffixes: tuple[str, ...] = (), units: tuple[str, ...] = (),
        skip: tuple[str, ...] = (),
    ) -> list[str]:  # fmt: skip
        """Pull every file under `sub` (with one of `suffixes`); the relative paths pulled. A folder named
        in `units` is pulled only as the consistent whole its last push left (else left as it is here);
        one named in `skip` not at all."""
        base = join(self.url, sub) if sub else self.url
        found = list_files(base, suffixes=suffixes, doing="listing the output folder")
        infos = {f"{sub.strip('/')}/{rel}" if sub else rel: info for rel, info in found.items()}
        infos = {rel: i for rel, i in infos.items() if not set(rel.split("/")[:-1]) & set(skip)}
        _check_no_file_prefix(base, sorted(infos))
        for folder in sorted({u for rel in infos if (u := _unit_of(rel, units)) is not None}):
            inside = {rel: i for rel, i in infos.items() if _unit_of(rel, units) == folder}
            if not self._whole(folder, inside):
                log.info("%s: not pulled (its last upload did not finish)", join(self.url, folder))
                infos = {rel: i for rel, i in infos.items() if rel not in inside}
        local_base = self.local / sub
        here = [self.rel(p) for p in local_base.rglob("*") if p.is_file() and not _hidden(p, local_base)] if (
            local_base.is_dir()) else []  # fmt: skip
        if suffixes:
            here = [r for r in here if r.lower().endswith(suffixes)]
        here = [r for r in here if _unit_of(r, units) is None and not set(r.split("/")[:-1]) & set(skip)]
        known: dict[str, RemoteInfo | None] = {**dict.fromkeys(here), **infos}
        self.pull(sorted(known), infos=known)
        return sorted(infos)

    def _whole(self, folder: str, inside: Mapping[str, RemoteInfo]) -> bool:
        """Whether a unit folder's remote files are exactly those its marker lists, in those versions."""
        try:
            listed = json.loads(self.fs.cat_file(self._remote(f"{folder}/{UNIT_MARKER}")))
        except FileNotFoundError:
            return False
        except ValueError:
            return False
        except Exception as exc:
            raise storage_error(exc, join(self.url, folder), "reading the output folder") from None
        versions = {rel: info.version for rel, info in inside.items()}
        return isinstance(listed, dict) and {f"{folder}/{k}": v for k, v in listed.items()} == versions

    # ------------------------------------------------------------------------------------------- push
    def push_unit(self, folder: str) -> int:
        """Upload a folder the stage writes as a whole (a training run's resume/): its marker is removed
        first and written last, listing every file's version, so a pull never takes a mix of two saves."""
        base = self.local / folder
        rels = sorted(self.rel(p) for p in base.rglob("*") if p.is_file() and not _hidden(p, base))
        changed = [r for r in rels if not self._unchanged(r, self._state(r))]
        if not changed and self._state(f"{folder}/{UNIT_MARKER}") is not None:
            return 0
        self._delete(f"{folder}/{UNIT_MARKER}", missing_ok=True)
        n = self.push(rels, deletions=False)
        listing = {r[len(folder) + 1 :]: str((self._state(r) or {}).get("version")) for r in rels}
        marker = self.local / STATE / "units" / folder / UNIT_MARKER
        write_text_atomic(marker, json.dumps(listing, sort_keys=True))
        with translated(join(self.url, folder), "uploading an output"):
            self.fs.put_file(str(marker), self._remote(f"{folder}/{UNIT_MARKER}"))
        write_text_atomic(self._state_path(f"{folder}/{UNIT_MARKER}"), "{}")
        return n

    def push(self, rels: Sequence[str], *, last: Sequence[str] = (), deletions: bool = True) -> int:
        """Upload the files of `rels` that changed locally, those of `last` after all others; remove
        remotely what was removed locally (`deletions`). Returns the number of files uploaded."""
        done = list(last)
        first = [r for r in rels if r not in done]
        for rel in done:  # a done-file about to change: the old one goes before the rest changes
            if (self.local / rel).is_file() and not self._unchanged(rel, self._state(rel)):
                self._delete(rel, missing_ok=True)
        n = 0
        for rel in [*first, *done]:
            local = self.local / rel
            if local.is_file():
                if not self._unchanged(rel, self._state(rel)):
                    self._upload(rel)
                    n += 1
            elif deletions and self._state(rel) is not None:
                self._delete(rel, missing_ok=True)
                self._forget(rel)
        return n

    def push_all(self, sub: str = "", *, last: Sequence[str] = (), units: tuple[str, ...] = ()) -> int:
        """Upload every local file under `sub` that is new or changed (nothing is removed remotely); the
        folders named in `units` each as a whole (`push_unit`)."""
        base = self.local / sub
        rels = sorted(self.rel(p) for p in base.rglob("*") if p.is_file() and not _hidden(p, self.local))
        whole = sorted({u for r in rels if (u := _unit_of(r, units)) is not None})
        plain = [r for r in rels if _unit_of(r, units) is None]
        n = sum(self.push_unit(folder) for folder in whole)
        return n + self.push(plain, last=[r for r in last if r in plain], deletions=False)

    def _upload(self, rel: str) -> None:
        final = self._remote(rel)
        head, name = final.rsplit("/", 1)
        tmp = f"{head}/.{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        url = join(self.url, rel)
        try:
            with translated(url, "uploading an output"):
                self.fs.put_file(str(self.local / rel), tmp)
                self.fs.mv(tmp, final)
                info = remote_info(self.fs, final)
        except StorageError:
            with contextlib.suppress(Exception):
                self.fs.rm_file(tmp)
            raise
        self._remember(rel, info.version)
        log.debug("uploaded %s", url)

    def _delete(self, rel: str, *, missing_ok: bool) -> None:
        try:
            self.fs.rm_file(self._remote(rel))
        except FileNotFoundError:
            if not missing_ok:
                raise
        except Exception as exc:
            raise storage_error(exc, join(self.url, rel), "removing an outdated output") from None
        self._forget(rel)


def _check_no_file_prefix(base: Url, rels: Sequence[str]) -> None:
    """StorageError when one key of the listing is also the folder of others (`x.bin` and `x.bin/...`):
    object storage allows it, a local folder cannot hold both."""
    folders = {"/".join(rel.split("/")[:i]): rel for rel in rels for i in range(1, rel.count("/") + 1)}
    for a in rels:
        if a in folders:
            b = folders[a]
            raise StorageError(
                f"{join(base, a)} is both an object and a folder of objects ({join(base, b)}, ...): a local "
                "copy of the folder cannot hold both. Give a URL below it, or move one of them (e.g. "
                "aws s3 mv)"
            )


def _unmirrorable(url: Url, exc: OSError) -> StorageError:
    return StorageError(
        f"{url}: cannot be kept in this machine's copy of the folder ({exc.strerror or exc}); an object "
        "whose key is also a folder of objects cannot be copied locally: give a URL below it, or move one "
        "of them"
    )


def _unit_of(rel: str, units: tuple[str, ...]) -> str | None:
    """The unit folder (named in `units`, at any depth) that `rel` lies in, as a relative path."""
    parts = rel.split("/")
    for i, part in enumerate(parts[:-1]):
        if part in units:
            return "/".join(parts[: i + 1])
    return None


def _hidden(path: Path, base: Path) -> bool:
    """Our bookkeeping (.wsi-sync), temporary files and any other dot name below `base`."""
    return any(part.startswith(".") for part in path.relative_to(base).parts)


def origin_of_output(path: Path, settings: StorageSettings | None = None) -> str | None:
    """The URL a path inside a mirror folder stands for (None for any other path)."""
    settings = settings or storage_settings()
    try:
        rel = path.absolute().relative_to(settings.root / "outputs")
    except ValueError:
        return None
    if not rel.parts:
        return None
    try:
        url = (
            (settings.root / "outputs" / rel.parts[0] / STATE / _URL_FILE).read_text(encoding="utf-8").strip()
        )
    except OSError:
        return None
    return str(join(url, *rel.parts[1:]))


__all__ = ["STATE", "Mirror", "mirror_dir", "origin_of_output"]

"""The output lock of a folder that may be this machine's mirror of a remote one: `output_lock` takes
this machine's lock (`wsi.core.output_lock`) and, for a mirror of a remote output folder, that folder's
lock object every machine honours (`wsi.storage.remote_lock`), released in the reverse order. A nested
take of a folder this process holds counts, as the local lock does. Messages name the URL."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wsi.core.errors import OutputLockedError, WsiError
from wsi.core.output_lock import output_lock as local_lock
from wsi.storage.mirror import origin_of_output
from wsi.storage.remote_lock import RemoteLock, default_command
from wsi.storage.urls import Url

_remote: dict[Path, list[object]] = {}  # folder -> [RemoteLock, depth] this process holds
_guard = threading.Lock()


def remote_of(folder: str | os.PathLike[str]) -> Url | None:
    """The URL a local folder stands for when it is this machine's mirror of a remote output folder."""
    try:
        url = origin_of_output(Path(folder).expanduser().absolute())
    except WsiError:
        return None
    return Url(url) if url else None


@contextmanager
def output_lock(folder: str | os.PathLike[str], command: str | None = None) -> Iterator[Path]:
    """`wsi.core.output_lock.output_lock`, plus the remote folder's lock for a mirror (see above)."""
    target = Path(folder).expanduser().absolute()
    url = remote_of(target)
    try:
        with local_lock(target, command) as held:
            if url is None:
                yield held
                return
            lock = _take(target, url, command or default_command())
            try:
                yield held
            finally:
                lost = _drop(target, lock)
            if lost and sys.exc_info()[0] is None:
                raise OutputLockedError(
                    f"{lost}: the outputs may mix both runs' files; check them, or run again"
                )
    except OutputLockedError as exc:
        if url is not None and str(target) in str(exc):  # this machine's lock of the mirror: name the URL
            raise OutputLockedError(str(exc).replace(str(target), str(url))) from None
        raise


def _take(folder: Path, url: Url, command: str) -> RemoteLock:
    with _guard:
        entry = _remote.get(folder)
        if entry is not None:
            entry[1] = int(entry[1]) + 1  # type: ignore[call-overload]
            return entry[0]  # type: ignore[return-value]
        lock = RemoteLock(url, command)
        lock.acquire()
        _remote[folder] = [lock, 1]
        return lock


def _drop(folder: Path, lock: RemoteLock) -> str:
    with _guard:
        entry = _remote[folder]
        entry[1] = int(entry[1]) - 1  # type: ignore[call-overload]
        if entry[1]:
            return ""
        del _remote[folder]
    lock.release()
    return lock.lost


__all__ = ["output_lock", "remote_of"]

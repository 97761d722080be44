"""The output lock of a folder that may be this machine's mirror of a remote one: `output_lock` takes
this machine's lock (`wsi.core.output_lock`) and, for a mirror of a remote output folder, that folder's
lock object every machine honours (`wsi.storage.remote_lock`), released in the reverse order. A nested
take of a folder this process holds counts, as the local lock does. Messages name the URL, and each
refusal the fix that fits its lock: another command of this machine (wait, or stop it: the kernel drops
its flock) or of another machine (wait, or remove the lock object once its lease is known to be stale)."""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from wsi.core.errors import OutputLockedError, WsiError
from wsi.core.output_lock import LOCK_NAME, read_holder
from wsi.core.output_lock import output_lock as local_lock
from wsi.storage.mirror import origin_of_output
from wsi.storage.remote_lock import RemoteLock, default_command, describe_holder
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
    with ExitStack() as stack:
        try:
            held = stack.enter_context(local_lock(target, command))
        except OutputLockedError:
            if url is None:
                raise
            raise OutputLockedError(_mirror_locked(url, target)) from None  # this machine's copy's lock
        except WsiError as exc:
            if url is None:
                raise
            raise WsiError(  # the cache folder cannot hold the lock file
                f"{url}: this machine's copy of the folder, in the local cache (WSI_CACHE_DIR), cannot hold "
                f"its lock file ({str(exc).rsplit('(', 1)[-1].rstrip(')')}); make the cache folder writable "
                "or point WSI_CACHE_DIR at one that is"
            ) from None
        if url is None:
            yield held
            return
        lock = _take(target, url, command or default_command())
        try:
            yield held
        finally:
            lost = _drop(target, lock)
        if lost and sys.exc_info()[0] is None:
            raise OutputLockedError(f"{lost}: the outputs may mix both runs' files; check them, or run again")


def _mirror_locked(url: Url, mirror: Path) -> str:
    """Why a command is refused when this machine's lock of its copy of `url` is held, and what to do:
    the holder is another command of this machine (or of one sharing its cache folder), so the way on is
    to wait for it or stop it; the flock is the kernel's and ends with its holder, so there is no file to
    remove, except where the cache is on a shared disk without flock."""
    holder = read_holder(mirror)
    pid = holder.get("pid")
    host = holder.get("host")
    here = host in (None, socket.gethostname())
    where = "on this machine" if here else f"on {host}, which shares this machine's cache folder"
    text = (
        f"{url} is in use by another wsi command {where} ({describe_holder(dict(holder))}): one command at a "
        "time writes into an output folder. Wait for it to finish"
    )
    if here and isinstance(pid, int):
        text += f" (or stop it: kill {pid})"
    text += " or choose another --out"
    if not here:  # no flock on a shared cache disk: the file stays when its holder dies there
        text += (
            f"; if that process is gone, remove the file {LOCK_NAME} in the folder "
            f"outputs/{mirror.name} of the cache (WSI_CACHE_DIR) on {socket.gethostname()}"
        )
    return text


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

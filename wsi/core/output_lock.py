"""One writer per output folder: the lock every command that writes into an --out folder takes first.

`output_lock(folder, command)` holds `folder/.wsi-lock` for the duration of a `with` block: an
exclusive `fcntl.flock` on the file (the kernel drops it when the holder dies, however it dies) and,
inside the file, who holds it (pid, host, start time, command line) so that a second writer is told
whom it is waiting for. Without this, two `wsi tile` runs into one folder with different settings
each rewrite the manifest from their own view, and the manifest no longer agrees with the tile files.

- A second process gets `OutputLockedError` (a WsiError: exit 2, one line) naming the holder.
- A lock file left by a process that is gone (killed, power loss) is taken over with a log line: the
  flock died with its holder; where the file system has no flock (some network mounts) the recorded
  pid is checked instead, on this host.
- The same process may take the lock of a folder it already holds (embed_slides runs the tile stage
  into its own folder): nested `with` blocks count, the outermost releases.
- The file is removed on release, so a finished command leaves nothing behind. Removing a flocked
  file is safe because a taker checks, after locking, that the path still names the file it locked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypedDict

from wsi.core.errors import OutputLockedError, WsiError

log = logging.getLogger(__name__)

LOCK_NAME = ".wsi-lock"

_held: dict[Path, list[int]] = {}  # folder -> [fd, depth] of the locks this process holds
_guard = threading.Lock()


def lock_path(folder: str | os.PathLike[str]) -> Path:
    return Path(folder) / LOCK_NAME


class Holder(TypedDict, total=False):
    """What a lock file says about the process holding it (`_write_holder`)."""

    pid: int
    host: str
    started: float  # time.time() when it took the lock
    command: str  # its command line, cut to 300 characters


def read_holder(folder: str | os.PathLike[str]) -> Holder:
    """What the lock file of `folder` says about its holder ({} when there is none or it is unreadable;
    a value of the wrong type, written by something else, is left out)."""
    try:
        data = json.loads(lock_path(folder).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError, RecursionError):
        return {}
    holder: Holder = {}
    if not isinstance(data, dict):
        return holder
    pid, host, started, command = (data.get(k) for k in ("pid", "host", "started", "command"))
    if isinstance(pid, int) and not isinstance(pid, bool):
        holder["pid"] = pid
    if isinstance(host, str):
        holder["host"] = host
    if isinstance(started, int | float) and not isinstance(started, bool):
        holder["started"] = float(started)
    if isinstance(command, str):
        holder["command"] = command
    return holder


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _describe(holder: Holder) -> str:
    started = holder.get("started")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)) if isinstance(started, float) else "?"
    )
    command = holder.get("command") or "?"
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, `{command}`, since {when}"


def _locked_message(folder: Path, holder: Holder) -> str:
    return (
        f"{folder} is in use by another wsi command ({_describe(holder)}): one command at a time writes "
        f"into an output folder. Wait for it to finish or choose another --out (if that process is gone "
        f"from a machine that shares this folder, remove {lock_path(folder)})"
    )


def _default_command() -> str:
    args = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else ["python"]
    text = " ".join(args)
    return text if len(text) <= 300 else text[:297] + "..."


def _flock(fd: int) -> bool | None:
    """True: locked; False: another holder; None: this file system has no flock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return None
        raise
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def _acquire(folder: Path, command: str) -> int:
    path = lock_path(folder)
    for _ in range(20):  # the holder may remove the file between our open and our lock: open again
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise WsiError(
                f"{folder}: cannot create the lock file {LOCK_NAME} ({exc.strerror or exc})"
            ) from None
        try:
            got = _flock(fd)
            holder = read_holder(folder)
            if got is False:
                raise OutputLockedError(_locked_message(folder, holder))
            if not _same_file(fd, path):
                os.close(fd)
                continue
            if got is None and _holder_alive(holder):
                raise OutputLockedError(_locked_message(folder, holder))
            if holder.get("pid") and holder.get("pid") != os.getpid():
                log.info(
                    "%s: taking over the lock left by %s, which is not running", folder, _describe(holder)
                )
            _write_holder(fd, command)
            return fd
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
    raise OutputLockedError(_locked_message(folder, read_holder(folder)))


def _holder_alive(holder: Holder) -> bool:
    """Without flock: a recorded holder counts as alive unless it is a dead pid on this host."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    if holder.get("host") != socket.gethostname():
        return True  # cannot look at another machine's processes
    return _pid_alive(pid)


def _write_holder(fd: int, command: str) -> None:
    data = Holder(pid=os.getpid(), host=socket.gethostname(), started=time.time(), command=command)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(data) + "\n").encode("utf-8"), 0)
    except OSError as exc:  # a full disk: the flock still guards the folder; the command's writes will say
        log.debug("could not record the lock holder: %s", exc)


def _release(folder: Path, fd: int) -> None:
    with contextlib.suppress(OSError):
        if _same_file(fd, lock_path(folder)):
            lock_path(folder).unlink()
    with contextlib.suppress(OSError):
        os.close(fd)  # closing drops the flock


@contextmanager
def output_lock(folder: str | os.PathLike[str], command: str | None = None) -> Iterator[Path]:
    """Hold `folder`'s lock (created with its parents when missing) for the `with` block; yield the folder.

    Raises OutputLockedError when another live process holds it."""
    target = Path(folder).expanduser().absolute()
    with _guard:
        entry = _held.get(target)
        if entry is not None:
            entry[1] += 1
        else:
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise WsiError(f"{target}: cannot create the output folder ({exc.strerror or exc})") from None
            _held[target] = [_acquire(target, command or _default_command()), 1]
    try:
        yield target
    finally:
        with _guard:
            entry = _held[target]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[target]
                _release(target, entry[0])


__all__ = ["LOCK_NAME", "Holder", "OutputLockedError", "lock_path", "output_lock", "read_holder"]

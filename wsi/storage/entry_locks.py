"""A cache entry folder's locks, shared by every cache wsi keeps (remote copies, image pyramids).

An entry is a folder holding `entry.json` beside its data. Three locks on two marker files keep
processes from stepping on each other: the writer's exclusive `.lock` while it fills the entry, a
reader's shared hold on `.in-use` while it reads the data, and the evictor's check that nobody holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

ENTRY = "entry.json"
_LOCK = ".lock"
_IN_USE = ".in-use"


@contextlib.contextmanager
def entry_locked(folder: Path, *, wait: bool = True) -> Iterator[bool]:
    """The writer's lock on `folder` (created): True while held; False at once when another process
    holds it and `wait` is off."""
    folder.mkdir(parents=True, exist_ok=True)
    with _flocked(folder / _LOCK, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB)) as held:
        yield held


def hold_entry(folder: Path) -> IO[str]:
    """A reader's shared hold on the entry `folder`; it lasts until the returned file is closed."""
    fh = open(folder / _IN_USE, "a+")  # noqa: SIM115 - held by the caller
    fcntl.flock(fh, fcntl.LOCK_SH)
    return fh


@contextlib.contextmanager
def entry_unheld(folder: Path) -> Iterator[bool]:
    """True (and no new reader can hold it meanwhile) when no reader holds the entry `folder`."""
    marker = folder / _IN_USE
    if not marker.exists():
        yield True
        return
    with _flocked(marker, fcntl.LOCK_EX | fcntl.LOCK_NB) as free:
        yield free


def read_entry(folder: Path) -> dict[str, Any]:
    """The entry's `entry.json` ({} when it is missing or not a JSON object: the entry is incomplete)."""
    try:
        data = json.loads((folder / ENTRY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextlib.contextmanager
def _flocked(path: Path, flags: int) -> Iterator[bool]:
    """An flock on `path` (created) with `flags`: True while held, False when LOCK_NB found it taken."""
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, flags)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


__all__ = ["ENTRY", "entry_locked", "entry_unheld", "hold_entry", "read_entry"]

"""Is a model folder's training finished? `wsi predict --model` and `wsi train --init-from` read a run
only when it is.

A run folder whose training is still running (its output lock, or its parent's for a fold, held: this
machine's flock, or the lock object of a remote folder, `wsi.storage.remote_lock`) or that stopped
before the end (epochs written, `last.safetensors` or `log.csv`, but no `metrics.json`, which training
writes last) holds an early checkpoint: predictions from it are not the model's. Both are refused,
naming the option, the folder, the holder and the way on (wait, or `--allow-unfinished`). A folder
with neither (weights and config.json only, as older versions and hand-made folders hold them) is taken
as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any

from wsi.core.errors import ConfigError
from wsi.core.output_lock import lock_path, read_holder
from wsi.storage import Url, location
from wsi.storage.remote_lock import RemoteLock, describe_holder

#: what training writes last (pipelines/train/run.py): a run folder without it did not finish
FINISHED_FILE = "metrics.json"
#: what training writes as epochs go (pipelines/train/loop.py)
EPOCH_FILES = ("last.safetensors", "log.csv", "resume/state.json")


def unfinished(model: str | os.PathLike[str]) -> str:
    """Why the run of `model` (a run folder, or a weights file in one; a path or a URL) is not finished
    training; "" when it is."""
    where = location(model, what="model")
    if isinstance(where, Url):
        return _remote(where.parent if where.suffix == ".safetensors" else Url(str(where).rstrip("/")))
    return _local(where.parent if where.suffix == ".safetensors" else where)


def _local(folder: Path) -> str:
    for place in (folder, folder.parent):  # a fold's run is locked at its parent
        holder = _held_by(place)
        if holder is not None:
            return f"its training is still running ({describe_holder(dict(holder))})"
    for run in [folder, *sorted(folder.glob("fold-*"))]:  # a cross-validation run: each fold too
        if not (run / FINISHED_FILE).is_file() and any((run / name).is_file() for name in EPOCH_FILES):
            where = "" if run == folder else f" ({run.name})"
            return f"its training stopped before the end{where} (epochs saved, but no {FINISHED_FILE})"
    return ""


def _held_by(folder: Path) -> dict[str, Any] | None:
    """The holder of `folder`'s output lock when a live process holds it, else None."""
    path = lock_path(folder)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return dict(read_holder(folder))
        except OSError:
            return None
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _remote(folder: Url) -> str:
    from wsi.storage.fs import filesystem, translated

    for where in (folder, folder.parent):
        state = RemoteLock(where, "wsi predict (looking)").read()
        if state is not None:
            lease = state.holder.get("lease_s")
            if not isinstance(lease, int | float) or state.age_s <= float(lease):
                return f"its training is still running ({describe_holder(state.holder)})"
    fs, root = filesystem(folder)
    root = root.rstrip("/")
    with translated(folder, "looking at the model folder"):
        fs.invalidate_cache(root)
        if not fs.exists(f"{root}/{FINISHED_FILE}") and any(fs.exists(f"{root}/{n}") for n in EPOCH_FILES):
            return f"its training stopped before the end (epochs saved, but no {FINISHED_FILE})"
    return ""


def refuse_unfinished(model: str | os.PathLike[str], *, allow: bool, option: str = "--model") -> None:
    """ConfigError (exit 2) for a model whose training is not finished, unless `allow`; `option` is the
    one that named it (--model, --init-from)."""
    why = unfinished(model)
    if why and not allow:
        raise ConfigError(
            f"{option} {model}: {why}; its weights are an early checkpoint, not the trained model. Wait for "
            "the training to finish (wsi train ... --resume goes on with a stopped one), or give "
            "--allow-unfinished to predict from the checkpoint as it is"
        )


__all__ = ["FINISHED_FILE", "refuse_unfinished", "unfinished"]

"""Pieces every command shares: turning user errors into clean messages and exit codes."""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from wsi.errors import WsiError

F = TypeVar("F", bound=Callable[..., Any])

#: exit code for a batch in which some items failed (the rest completed)
EXIT_PARTIAL_FAILURE = 1
#: exit code for a usage or input error before any work started
EXIT_USAGE = 2


def user_errors(func: F) -> F:
    """Print a `WsiError` as one clear line (no traceback) and exit with code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except WsiError as exc:
            click.echo(f"Error: {exc}", err=True)
            raise SystemExit(EXIT_USAGE) from None

    return cast(F, wrapper)


def ensure_writable_dir(path: str | os.PathLike[str], option: str = "--out") -> Path:
    """Create the output folder `path` if missing and prove it writable, before any work starts.

    Raises WsiError (a `@user_errors` command prints it and exits 2) naming the folder and the fix. The
    check writes and removes a temporary file, because permission bits are not the answer: root writes
    into read-only folders, and ACLs, read-only mounts and full disks only show when writing.
    """
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise WsiError(f"{option} {folder}: exists and is not a folder; give a folder path") from None
    except OSError as exc:  # a parent is a file, no permission, a read-only mount
        blocker = next((p for p in folder.parents if p.exists()), None)
        why = f"{blocker} is a file, not a folder" if blocker and not blocker.is_dir() else exc.strerror
        raise WsiError(
            f"{option} {folder}: cannot create the folder ({why or exc}); choose a folder you can write "
            "to, or create it first"
        ) from None
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".wsi-write-test-"):
            pass
    except OSError as exc:
        raise WsiError(
            f"{option} {folder}: cannot write into the folder ({exc.strerror or exc}); choose a folder you "
            f"can write to, or fix its permissions (e.g. chmod u+w {folder})"
        ) from None
    return folder


# Options several commands share that no config model owns (train's; tile, embed and predict build
# theirs from their configs with wsi.cli._options).
def scheduler_option(
    help_text: str = "Run on an existing dask.distributed cluster (e.g. tcp://host:8786).",
) -> Callable[[F], F]:
    return click.option("--scheduler", default=None, metavar="ADDRESS", help=help_text)


def mpp_option(help_text: str) -> Callable[[F], F]:
    from wsi.cli._options import FiniteFloatRange
    from wsi.config import MAX_MPP

    mpp = FiniteFloatRange(min=0, max=MAX_MPP, min_open=True)
    return click.option("--mpp", type=mpp, default=None, help=help_text)

"""Pieces every command shares: turning user errors into clean messages and exit codes."""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from wsi.core.errors import WsiError

if TYPE_CHECKING:
    from wsi.storage import Url

F = TypeVar("F", bound=Callable[..., Any])

#: exit code for a batch in which some items failed (the rest completed)
EXIT_PARTIAL_FAILURE = 1
#: exit code for a usage or input error before any work started
EXIT_USAGE = 2
#: exit code after Ctrl-C (128 + SIGINT, as shells report it)
EXIT_INTERRUPTED = 130

#: what to do after Ctrl-C, by command: outputs are written atomically, so what finished is kept
AFTER_INTERRUPT = {
    "tile": "finished slides are kept; run the same command again to go on (they are skipped)",
    "embed": "finished bags are kept; run the same command again to go on (they are skipped)",
    "embed-slides": "finished embeddings are kept; run the same command again to go on (they are skipped)",
    "predict": "finished slides are in --out; run the same command again to go on (they are skipped)",
    "train": "finished epochs are kept in --out; add --resume to the same command to continue",
    "demo": "run it again to go on: finished stages are re-used",
}


def user_errors(func: F) -> F:
    """Print a `WsiError` as one clear line (no traceback) and exit with code 2; after Ctrl-C, say how
    to go on (click's own `Aborted!` says nothing of the work kept) and exit 130."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except WsiError as exc:
            from wsi.storage.masking import shown

            click.echo(f"Error: {shown(exc)}", err=True)
            raise SystemExit(EXIT_USAGE) from None
        except KeyboardInterrupt:
            ctx = click.get_current_context(silent=True)
            name = ctx.info_name if ctx is not None else None
            hint = AFTER_INTERRUPT.get(str(name))
            click.echo(f"\nwsi {name}: interrupted" + (f"; {hint}" if hint else ""), err=True)
            raise SystemExit(EXIT_INTERRUPTED) from None

    return cast(F, wrapper)


def ensure_writable_dir(path: str | os.PathLike[str], option: str = "--out") -> Path | Url:
    """Create the output folder `path` if missing and prove it writable, before any work starts (a URL:
write and remove a small object there).

    Raises WsiError (a `@user_errors` command prints it and exits 2) naming the folder and the fix. The
    check writes and removes a temporary file, because permission bits are not the answer: root writes
    into read-only folders, and ACLs, read-only mounts and full disks only show when writing.
    """
    from wsi.storage import is_url, remote_output

    if is_url(path):  # a bucket that is missing, or credentials refused: exit 2 before any work
        mirror = remote_output(path)
        assert mirror is not None
        return mirror.url
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
    from wsi.core.config import MAX_MPP

    mpp = FiniteFloatRange(min=0, max=MAX_MPP, min_open=True)
    return click.option("--mpp", type=mpp, default=None, help=help_text)

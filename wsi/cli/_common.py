"""Pieces every command shares: turning user errors into clean messages and exit codes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

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

    return wrapper  # type: ignore[return-value]

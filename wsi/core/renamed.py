"""Old names of renamed functions: each still works for code written against an earlier release, and
says once per call site (a DeprecationWarning) which name to use instead."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def renamed(func: Callable[P, R], old_name: str) -> Callable[P, R]:
    """`func` under its old name: the same call, with a DeprecationWarning naming the new one."""
    new_name = f"{func.__module__}.{func.__qualname__}"

    @functools.wraps(func)
    def old(*args: P.args, **kwargs: P.kwargs) -> R:
        warnings.warn(f"{old_name} is deprecated: use {new_name}", DeprecationWarning, stacklevel=2)
        return func(*args, **kwargs)

    old.__name__ = old.__qualname__ = old_name.rpartition(".")[2]
    old.__doc__ = f"Deprecated name of `{new_name}`."
    return old


__all__ = ["renamed"]

"""Old names of renamed functions and keywords: each still works for code written against an earlier
release, and says once per call site (a DeprecationWarning) which name to use instead."""

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


def renamed_keywords(**old_to_new: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A function that also takes its keywords' old names (`@renamed_keywords(size_um="side_um")`),
    each with a DeprecationWarning; passing both names is a TypeError, as any doubled argument is."""

    def wrap(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{func.__qualname__}() got both {old}= and its new name {new}=")
                    message = f"{func.__qualname__}({old}=...) is deprecated: use {new}="
                    warnings.warn(message, DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return call

    return wrap


__all__ = ["renamed", "renamed_keywords"]

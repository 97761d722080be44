"""Old names of renamed functions, keywords and config fields: each still works for code and files written
against an earlier release; code is told once per call site (a DeprecationWarning) which name to use."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

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


def new_names(cls: Any, data: Any) -> Any:
    """`data` with the old names of `cls`'s renamed fields (its class attribute `OLD_NAMES`, old -> new)
    turned into the new ones, for a config's `model_validator(mode="before")`: task files and run records
    written before a rename still load. Both names at once is an error."""
    old_names: Mapping[str, str] = getattr(cls, "OLD_NAMES", {})
    if not isinstance(data, Mapping) or not old_names.keys() & data.keys():
        return data
    out = dict(data)
    for old, new in old_names.items():
        if old in out:
            if new in out:
                raise ValueError(f"{old!r} is the old name of {new!r}: give only {new!r}")
            out[new] = out.pop(old)
    return out


__all__ = ["new_names", "renamed", "renamed_keywords"]

"""One registry mechanism for every family: encoders, attention variants, model kinds, input kinds.

A member registers itself with a decorator beside its definition (`@ATTENTION.register("seqnorm")`).
A registry may name the modules that hold its members; they are imported on first lookup, so a family
whose members need optional packages (DICOM readers, say) costs nothing until it is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from wsi.core.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> members of one family (classes or factories)."""

    def __init__(self, family: str, *, modules: tuple[str, ...] = ()) -> None:
        self.family = family
        self._modules = modules
        self._members: dict[str, T] = {}
        self._loaded = not modules
        self._missing: dict[str, str] = {}  # module -> why it could not be imported

    def register(self, name: str) -> Callable[[T], T]:
        def add(member: T) -> T:
            if name in self._members and self._members[name] is not member:
                raise ValueError(f"{self.family} {name!r} is registered twice")
            self._members[name] = member
            return member

        return add

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self._modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:  # an optional package missing: its members stay unknown
                self._missing[module] = str(exc)

    def get(self, name: str) -> T:
        self._load()
        try:
            return self._members[name]
        except KeyError:
            hint = "".join(
                f"; {module} could not be loaded ({why}): install what it names"
                for module, why in self._missing.items()
            )
            raise ConfigError(
                f"unknown {self.family} {name!r}; choose one of {', '.join(self.names())}{hint}"
            ) from None

    def names(self) -> list[str]:
        self._load()
        return sorted(self._members)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._members

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


__all__ = ["Registry"]

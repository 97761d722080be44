"""Names a package offers without importing the modules that define them until first use (PEP 562).

A package whose members need torch stays cheap to import: `from wsi.models import build_model` imports
the presets module then, and `import wsi.models` alone imports nothing heavy. The package still names
its members under `if TYPE_CHECKING:` so mypy and readers see where each comes from.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`: `exports` maps a module (an absolute dotted path) to
    the names it defines that the package offers, as the package's `if TYPE_CHECKING:` imports read; the
    first access to a name imports its module and keeps the value in the package.
    A submodule not in `exports` is imported on access too: `import wsi.models` then `wsi.models.presets`
    works, as attribute access to a package's submodules is expected to."""

    home_of = {name: module for module, names in exports.items() for name in names}

    def module_getattr(name: str) -> Any:
        home = sys.modules[package]
        if name in home_of:
            value = getattr(importlib.import_module(home_of[name]), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(home, name, value)
        return value

    def module_dir() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(home_of))

    return module_getattr, module_dir


__all__ = ["lazy_exports"]

"""Every config model of the package (`@config_model` dataclasses), found by importing every module.

Shared by the hostile-number tests: a new config anywhere is checked without being listed.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import sys
from functools import cache

PACKAGES = ("wsi", "wsi.models", "wsi.pipelines", "wsi.configs")


@cache
def config_classes() -> tuple[type, ...]:
    for name in PACKAGES:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if info.name.startswith("wsi.cli") or ".device_decode" in info.name:
                continue
            importlib.import_module(info.name)
    found: dict[str, type] = {}
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("wsi"):
            continue
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and dataclasses.is_dataclass(obj)
                and hasattr(obj, "__wsi_finite__")
                and obj.__module__.startswith("wsi")
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return tuple(found[k] for k in sorted(found))

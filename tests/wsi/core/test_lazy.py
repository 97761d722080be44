"""The packages that load their names on first use (wsi.core.lazy): importing one imports no torch, and
every name its `if TYPE_CHECKING:` block imports is, at run time, the very object of the module named."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from wsi.core.lazy import lazy_exports

LAZY = ("wsi.models", "wsi.models.attention", "wsi.models.encoders", "wsi.models.slide_encoders",
        "wsi.models.text_encoders")  # fmt: skip


def _type_checking_imports(package: str) -> list[tuple[str, str]]:
    """(module, name) of every import in the package's `if TYPE_CHECKING:` block."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    blocks = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    assert blocks, f"{package} has no TYPE_CHECKING block"
    return [(imp.module or "", alias.name) for imp in blocks[0].body if isinstance(imp, ast.ImportFrom)
            for alias in imp.names]  # fmt: skip


@pytest.mark.parametrize("package", LAZY)
def test_importing_the_package_imports_no_torch(package: str) -> None:
    code = f"import sys, {package}\nprint([m for m in ('torch', 'timm', 'einops') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("package", LAZY)
def test_every_typed_name_is_the_defining_modules_object(package: str) -> None:
    mod = importlib.import_module(package)
    names = _type_checking_imports(package)
    for module, name in names:
        assert getattr(mod, name) is getattr(importlib.import_module(module), name), f"{package}.{name}"
    assert {n for _, n in names} <= set(mod.__all__) and set(mod.__all__) <= set(dir(mod))


def test_an_unknown_name_is_an_attribute_error_and_a_submodule_loads_on_access() -> None:
    models = importlib.import_module("wsi.models")
    with pytest.raises(AttributeError, match=r"module 'wsi\.models' has no attribute 'build_modle'"):
        models.build_modle  # noqa: B018
    assert models.presets is importlib.import_module("wsi.models.presets")
    module_getattr, _ = lazy_exports("wsi.models", {})
    with pytest.raises(AttributeError):
        module_getattr("__path_hooks__")  # dunder lookups are never taken for submodules

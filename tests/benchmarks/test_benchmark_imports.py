"""Benchmarks import the installed package: `python benchmarks/x.py` runs against what `pip install` put
in place (the editable install maps wsi.models etc. to the top folders), never a folder put on sys.path,
and a benchmark's helper modules beside it are imported as siblings (Python puts the script's folder on
sys.path). pyproject's pytest `pythonpath = ["benchmarks"]` lets tests import them the same way."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def _touches_sys_path(tree: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
        for node in ast.walk(tree)
    )  # fmt: skip


def _package_imports(tree: ast.AST) -> list[str]:
    """`benchmarks.x` imports: they need the repository's root on sys.path, which a script does not have."""
    found = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    found += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return [m for m in found if m == "benchmarks" or m.startswith("benchmarks.")]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_benchmark_touches_sys_path(script: Path) -> None:
    tree = ast.parse(script.read_text(encoding="utf-8"))
    assert not _touches_sys_path(tree), f"{script.name} reads or changes sys.path: import the installed wsi"
    assert not _package_imports(tree), f"{script.name} imports {_package_imports(tree)}: import the sibling"


def test_the_rule_catches_an_insertion() -> None:
    tree = ast.parse("import sys\nfrom pathlib import Path\nsys.path.insert(0, str(Path('.')))\n")
    assert _touches_sys_path(tree)
    package = ast.parse("from benchmarks.mil_data import write_cohort\n")
    assert _package_imports(package) == ["benchmarks.mil_data"]


@pytest.mark.parametrize(
    "argv",
    [["gpu_suite.py", "--help"],  # its sections, then their feed sections: siblings importing siblings
     ["scaling_report.py"]],  # imports wsi.core.files at module level, runs nothing
    ids=["siblings", "installed-wsi"],
)  # fmt: skip
def test_a_benchmark_runs_as_a_script_from_anywhere(argv: list[str], tmp_path: Path) -> None:
    """From another folder and without PYTHONPATH: only the install and the script's folder are there."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / argv[0]), *argv[1:]], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def test_no_two_benchmarks_import_each_other() -> None:
    """Sibling imports point one way (shared helpers live in `_x.py` modules beside the scripts)."""
    from import_graph import cycles

    names = {p.stem for p in SCRIPTS}
    links: dict[str, set[str]] = {}
    for script in SCRIPTS:
        tree = ast.parse(script.read_text(encoding="utf-8"))
        found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        found |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        links[script.stem] = found & names - {script.stem}
    assert cycles(links) == []
    assert cycles({"tile_ceiling": {"tile_throughput"}, "tile_throughput": {"tile_ceiling"}})  # it can fail


def test_tile_costs_times_functions_that_exist() -> None:
    """benchmarks/tile_costs.py swaps each (module, function) of STEPS for a timer: a renamed function
    would make the benchmark fail (or time nothing), so every one must still be there."""
    import importlib

    import tile_costs

    missing = [
        f"{module}.{name}" for module, name, _ in tile_costs.STEPS
        if not callable(getattr(importlib.import_module(module), name, None))
    ]  # fmt: skip
    assert not missing, f"benchmarks/tile_costs.py times functions that no longer exist: {missing}"

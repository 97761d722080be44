"""The architecture as a test: no import circles of any kind, layers point one way, private names stay home.

Rules (docs/architecture.md):
- `wsi.models` never imports `wsi.pipelines`; the slide side of `wsi` (every module outside `wsi.cli`,
  `wsi.models`, `wsi.pipelines`, `wsi.configs`) imports neither; no library module imports `wsi.cli`.
- No import circle between modules. Every import counts: deferred ones inside functions and the
  `if TYPE_CHECKING:` ones too (a type is a dependency: the shared protocol belongs below both sides).
- A name starting with `_` is never imported from another module, and a `_module` is imported only
  by modules of its own package.
Modules are found from pyproject.toml's [tool.wsi.package-folders], the same table the wheel is built
from, so a new module or package is checked without being listed here.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["wsi"][
    "package-folders"
]
UPPER = ("wsi.cli", "wsi.models", "wsi.pipelines", "wsi.configs")  # everything else in wsi is slide side


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        root = REPO / folder
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _imports(path: Path, module: str, *, top_level_only: bool) -> list[tuple[str, list[str]]]:
    """(imported module, names) for every import, TYPE_CHECKING blocks included; relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, list[str]]] = []
    is_package = path.name == "__init__.py"

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                out.extend((alias.name, []) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = module.split(".")
                    parent = parent if is_package else parent[:-1]
                    parent = parent[: len(parent) - (node.level - 1)]
                    base = ".".join([*parent, base] if base else parent)
                out.append((base, [a.name for a in node.names]))
            if top_level_only:
                if isinstance(node, (ast.If, ast.Try, ast.With)):
                    visit(list(ast.iter_child_nodes(node)))  # type: ignore[arg-type]
            else:
                children = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
                visit(children)

    visit(tree.body)
    return out


def _resolve(target: str, names: list[str], modules: dict[str, Path]) -> list[str]:
    """The project modules an import statement loads (a `from pkg import mod` loads pkg.mod)."""
    hits = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
    if target in modules:
        hits.append(target)
    return hits


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for target, names in _imports(path, module, top_level_only=top_level_only):
            graph[module].update(t for t in _resolve(target, names, modules) if t != module)
    return graph


def _parents(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    # A package importing its own submodules (re-exports) is not a circle of ideas: edges into one's own
    # ancestors are dropped.
    edges = {m: {t for t in ts if t not in _parents(m)} for m, ts in graph.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node)
    return cycles


def test_no_import_circles() -> None:
    cycles = _cycles(_graph(top_level_only=False))
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    breaches = []
    for module, targets in graph.items():
        slide_side = not any(_within(module, upper) for upper in UPPER)
        for target in targets:
            if _within(module, "wsi.models") and _within(target, "wsi.pipelines"):
                breaches.append(f"{module} -> {target}")
            if slide_side and (_within(target, "wsi.models") or _within(target, "wsi.pipelines")):
                breaches.append(f"{module} -> {target}")
            if not _within(module, "wsi.cli") and _within(target, "wsi.cli"):
                breaches.append(f"{module} -> {target}")
    return sorted(breaches)


def test_layers_point_one_way() -> None:
    assert _layer_breaches(_graph(top_level_only=False)) == []


def _private_breaches() -> list[str]:
    modules = _modules()
    out = []
    for module, path in modules.items():
        own_package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for target, names in _imports(path, module, top_level_only=False):
            if not _within(target, "wsi"):
                continue
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    full = f"{target}.{name}"
                    if full in modules:  # importing a private module: only from its own package
                        if target != own_package:
                            out.append(f"{module} imports {full}")
                    else:
                        out.append(f"{module} imports {target}.{name}")
            private_parts = [p for p in target.split(".") if p.startswith("_") and not p.startswith("__")]
            if private_parts:
                home = target.rpartition(".")[0]
                if home != own_package:
                    out.append(f"{module} imports {target}")
    return sorted(set(out))


def test_private_names_stay_in_their_package() -> None:
    assert _private_breaches() == []


def test_every_module_is_checked() -> None:
    """The slide-side modules the old hand-kept list missed are in the graph and judged slide side."""
    modules = _modules()
    for name in ("wsi.thumbnail", "wsi.tiff_tiles", "wsi.background", "wsi.slide_info", "wsi.config",
                 "wsi.registry", "wsi.errors", "wsi.clinical_images", "wsi.models.chunked",
                 "wsi.pipelines.tile.stage", "wsi.configs"):  # fmt: skip
        assert name in modules, name
    assert len(modules) == sum(1 for folder in FOLDERS.values() for _ in (REPO / folder).rglob("*.py"))


def test_the_checker_sees_breaches(tmp_path: Path) -> None:
    """Guard against a checker that cannot fail: a TYPE_CHECKING circle and a layer breach are caught."""
    a = tmp_path / "a.py"
    a.write_text(
        "from typing import TYPE_CHECKING\nfrom wsi.models.x import _hidden\nimport wsi.pipelines.y\n"
        "if TYPE_CHECKING:\n    from wsi.slide import Slide\n"
    )
    got = _imports(a, "wsi.models.a", top_level_only=True)
    assert ("wsi.models.x", ["_hidden"]) in got and ("wsi.pipelines.y", []) in got
    assert ("wsi.slide", ["Slide"]) in got  # a type-only import counts
    assert _cycles({"wsi.slide": {"wsi.thumbnail"}, "wsi.thumbnail": {"wsi.slide"}})
    assert _layer_breaches({"wsi.thumbnail": {"wsi.models.mil"}, "wsi.models.mil": {"wsi.pipelines.x"}}) == [
        "wsi.models.mil -> wsi.pipelines.x",
        "wsi.thumbnail -> wsi.models.mil",
    ]

"""The architecture as a test: no import circles, layers point one way, private names stay home.

Rules (docs/architecture.md):
- `models/` never imports `pipelines/`; the slide, tiling and bag modules of `wsi/` never import
  `models/` or `pipelines/`; no library module imports `wsi.cli`.
- No import circle between modules (deferred imports count; `if TYPE_CHECKING:` blocks excluded).
- A name starting with `_` is never imported from another module, and a `_module` is imported only
  by modules of its own package.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("wsi", "models", "pipelines", "configs")
# wsi modules (and packages, with their submodules) that must stay free of models/pipelines
SLIDE_CORE = (
    "wsi.slide",
    "wsi.region",
    "wsi.tissue",
    "wsi.tiling",
    "wsi.tilefile",
    "wsi.bags",
    "wsi.hdf5",
    "wsi.suffixes",
    "wsi.sources",
    "wsi.files",
    "wsi.qc",
    "wsi.qupath",
    "wsi.synthetic",
)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, module: str, *, top_level_only: bool) -> list[tuple[str, list[str]]]:
    """(imported module, names) for every import; relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, list[str]]] = []
    is_package = path.name == "__init__.py"

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node):
                continue
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


def test_no_import_circles() -> None:
    graph = _graph(top_level_only=False)  # a deferred import inside a function still closes a circle
    # A package importing its own submodules (re-exports) is not a circle of ideas: drop child -> parent
    # edges where the parent merely re-exports, i.e. ignore edges into one's own ancestors.
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
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _layer_breaches() -> list[str]:
    graph = _graph(top_level_only=False)
    breaches = []
    for module, targets in graph.items():
        for target in targets:
            if module.startswith("models") and target.startswith("pipelines"):
                breaches.append(f"{module} -> {target}")
            # a package in SLIDE_CORE (wsi.bags, wsi.synthetic) covers its modules too
            in_core = any(module == core or module.startswith(f"{core}.") for core in SLIDE_CORE)
            if in_core and target.split(".")[0] in {"models", "pipelines"}:
                breaches.append(f"{module} -> {target}")
            in_cli = module == "wsi.cli" or module.startswith("wsi.cli.")
            if not in_cli and (target == "wsi.cli" or target.startswith("wsi.cli.")):
                breaches.append(f"{module} -> {target}")
    return sorted(breaches)


def test_layers_point_one_way() -> None:
    assert _layer_breaches() == []


def _private_breaches() -> list[str]:
    modules = _modules()
    out = []
    for module, path in modules.items():
        own_package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for target, names in _imports(path, module, top_level_only=False):
            if target.split(".")[0] not in PACKAGES:
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


def test_the_checker_sees_breaches(tmp_path: Path) -> None:
    """Guard against a checker that cannot fail: parse a synthetic circle and breach."""
    a = tmp_path / "a.py"
    a.write_text("from models.x import _hidden\nimport pipelines.y\n")
    got = _imports(a, "models.a", top_level_only=True)
    assert ("models.x", ["_hidden"]) in got and ("pipelines.y", []) in got

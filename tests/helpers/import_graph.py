"""The project's import graph, read from the source with `ast` (nothing is imported): every module the
package-folder table of pyproject.toml installs, and the project modules each one imports, deferred and
`if TYPE_CHECKING:` imports included. Used by tests/project/test_layering.py and docs/architecture_picture.py.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path


def folders(repo: Path) -> dict[str, str]:
    """Import name -> repository folder (pyproject.toml [tool.wsi.package-folders])."""
    table = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))
    return dict(table["tool"]["wsi"]["package-folders"])


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def modules(repo: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in folders(repo).items():
        root = repo / folder
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def imports(path: Path, module: str, *, top_level_only: bool) -> list[tuple[str, list[str]]]:
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


def resolve(target: str, names: list[str], modules: dict[str, Path]) -> list[str]:
    """The project modules an import statement loads (a `from pkg import mod` loads pkg.mod)."""
    hits = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
    if target in modules:
        hits.append(target)
    return hits


def graph(repo: Path, *, top_level_only: bool = False) -> dict[str, set[str]]:
    found = modules(repo)
    out: dict[str, set[str]] = {m: set() for m in found}
    for module, path in found.items():
        for target, names in imports(path, module, top_level_only=top_level_only):
            out[module].update(t for t in resolve(target, names, found) if t != module)
    return out


def parents(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def cycles(links: dict[str, set[str]]) -> list[list[str]]:
    # A package importing its own submodules (re-exports) is not a circle of ideas: edges into one's own
    # ancestors are dropped.
    edges = {m: {t for t in ts if t not in parents(m)} for m, ts in links.items()}
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

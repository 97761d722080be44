"""The architecture as a test: no import circles of any kind, layers point one way, private names stay home.

Rules (docs/architecture.md, "Layers"):
- Every module belongs to one layer of `LAYERS` (the longest matching prefix), and imports only modules
  of lower layers or of its own package: the core at the bottom, then slides, tiling and formats, the
  models, the stages, and the command line and front door at the top. So no library module imports
  `wsi.cli`, `wsi.models` never imports `wsi.pipelines`, and the slide side imports neither.
- No import circle between modules. Every import counts: deferred ones inside functions and the
  `if TYPE_CHECKING:` ones too (a type is a dependency: the shared protocol belongs below both sides).
- At most 12 modules directly in `wsi/`, `models/` and `pipelines/`, and 20 in any subpackage.
- A name starting with `_` is never imported from another module, and a `_module` is imported only
  by modules of its own package.
Modules are found from pyproject.toml's [tool.wsi.package-folders], the same table the wheel is built
from, so a new module or package is checked without being listed here.
"""

from __future__ import annotations

from pathlib import Path

import import_graph as ig
from import_graph import folders, graph, imports, parents, within

REPO = Path(__file__).resolve().parents[2]
FOLDERS = folders(REPO)
# Bottom to top. A module's layer is that of the longest prefix here that names it; it may import its own
# package (the prefix it matched) and any lower layer. Equal numbers are neighbours that never import each
# other.
LAYERS: dict[str, int] = {
    "wsi.core": 0,
    "wsi.configs": 1,
    "wsi.storage": 2,
    "wsi.slides": 3,
    "wsi.synthetic": 4,
    "wsi.tiling": 4,
    "wsi.formats": 5,
    "wsi.view": 6,
    "wsi.models.attention": 10,
    "wsi.models.layers": 11,
    "wsi.models.base": 12,
    "wsi.models.encoders": 12,
    "wsi.models.explain": 12,
    "wsi.models.segmentation": 13,
    "wsi.models.slide_encoders": 13,
    "wsi.models.text_encoders": 13,
    "wsi.models.baselines": 13,
    "wsi.models.mil": 13,
    "wsi.models.abmil": 13,
    "wsi.models.heads": 13,
    "wsi.models.vit": 13,
    "wsi.models.presets": 14,
    "wsi.models": 15,
    "wsi.pipelines.scheduling": 20,
    "wsi.pipelines.stats": 20,
    "wsi.pipelines.inputs": 21,
    "wsi.pipelines.study": 22,
    "wsi.pipelines.report": 23,
    "wsi.pipelines.runs": 24,
    "wsi.pipelines.tile": 25,
    "wsi.pipelines.embed": 26,
    "wsi.pipelines.embed_slides": 26,
    "wsi.pipelines.train": 27,
    "wsi.pipelines.predict": 28,
    "wsi.pipelines.demo": 29,
    "wsi.pipelines.zero_shot": 29,
    "wsi.pipelines": 29,
    "wsi.cli": 30,
    "wsi.api": 31,
    "wsi": 32,
}
MAX_TOP_MODULES = 12
MAX_PACKAGE_MODULES = 20


def test_no_import_circles() -> None:
    found = ig.cycles(graph(REPO))
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def _layer(module: str) -> tuple[str, int]:
    """(the LAYERS prefix that names `module`, its layer)."""
    prefix = max((p for p in LAYERS if within(module, p)), key=len)
    return prefix, LAYERS[prefix]


def _layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    breaches = []
    for module, targets in graph.items():
        home, level = _layer(module)
        for target in targets:
            if target in parents(module):  # a package's own __init__ (re-exports) is not a layer edge
                continue
            there, target_level = _layer(target)
            if there != home and target_level >= level:
                breaches.append(f"{module} -> {target}")
    return sorted(breaches)


def test_layers_point_one_way() -> None:
    assert _layer_breaches(graph(REPO)) == []


def _private_breaches() -> list[str]:
    modules = ig.modules(REPO)
    out = []
    for module, path in modules.items():
        own_package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for target, names in imports(path, module, top_level_only=False):
            if not within(target, "wsi"):
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
    """Every module is in the graph, and every package has a layer of its own (a new subpackage must be
    placed in LAYERS, not fall into its parent's layer unseen)."""
    modules = ig.modules(REPO)
    for name in ("wsi.slides.thumbnail", "wsi.tiling.background", "wsi.core.config", "wsi.configs",
                 "wsi.models.layers.chunked", "wsi.pipelines.inputs.clinical", "wsi.pipelines.tile.stage"):
        assert name in modules, name
    assert len(modules) == sum(1 for folder in FOLDERS.values() for _ in (REPO / folder).rglob("*.py"))
    unplaced = sorted(
        m for m, path in modules.items()
        if path.name == "__init__.py" and "." in m
        and m.count(".") == 1 + (m.split(".")[1] in ("models", "pipelines")) and m not in LAYERS
    )  # fmt: skip
    assert unplaced == [], f"packages without a layer in LAYERS: {unplaced}"


def test_folders_hold_few_modules() -> None:
    """A newcomer sees the architecture from the tree: few modules loose at the top of each folder the
    owner named, and no subpackage so big that it must hold more than one job."""
    loose = {folder: sorted(p.name for p in (REPO / folder).glob("*.py") if p.name != "__init__.py")
             for folder in ("wsi", "models", "pipelines")}  # fmt: skip
    assert {f: n for f, n in loose.items() if len(n) > MAX_TOP_MODULES} == {}
    big = {}
    for folder in FOLDERS.values():
        for package in (REPO / folder).rglob("__init__.py"):
            n = sum(1 for p in package.parent.glob("*.py") if p.name != "__init__.py")
            if package.parent != REPO / folder and n > MAX_PACKAGE_MODULES:
                big[str(package.parent.relative_to(REPO))] = n
    assert big == {}


def test_the_checker_sees_breaches(tmp_path: Path) -> None:
    """Guard against a checker that cannot fail: a TYPE_CHECKING circle and a layer breach are caught."""
    a = tmp_path / "a.py"
    a.write_text(
        "from typing import TYPE_CHECKING\nfrom wsi.models.x import _hidden\nimport wsi.pipelines.y\n"
        "if TYPE_CHECKING:\n    from wsi.slides.slide import Slide\n"
    )
    got = imports(a, "wsi.models.a", top_level_only=True)
    assert ("wsi.models.x", ["_hidden"]) in got and ("wsi.pipelines.y", []) in got
    assert ("wsi.slides.slide", ["Slide"]) in got  # a type-only import counts
    assert ig.cycles({"wsi.slides.slide": {"wsi.slides.region"}, "wsi.slides.region": {"wsi.slides.slide"}})
    upward = {
        "wsi.slides.thumbnail": {"wsi.models.mil", "wsi.slides.region"},
        "wsi.models.mil": {"wsi.pipelines.x"},
        "wsi.tiling.grid": {"wsi.synthetic.scene"},
        "wsi.core.files": {"wsi.cli.main"},
    }
    assert _layer_breaches(upward) == [
        "wsi.core.files -> wsi.cli.main",
        "wsi.models.mil -> wsi.pipelines.x",
        "wsi.slides.thumbnail -> wsi.models.mil",
        "wsi.tiling.grid -> wsi.synthetic.scene",  # neighbours on one layer never import each other
    ]

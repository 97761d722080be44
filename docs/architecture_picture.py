"""Draw the house: docs/architecture.png (or another checkout's picture) from the code's own imports.

A room is a package of the first level under `wsi/`, `models/` or `pipelines/` (wsi.slides,
wsi.models.encoders, wsi.pipelines.tile), or a module loose at the top of one of those folders; its area is
its lines. A room stands on a floor above every room it imports, so arrows point down; rooms that import
each other (a circle between packages, even without a circle between modules) are drawn red on one floor.

    .venv/bin/python docs/architecture_picture.py                       # docs/architecture.png
    .venv/bin/python docs/architecture_picture.py --repo OLD --out docs/architecture_before.png
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "helpers"))

import import_graph as ig  # noqa: E402

COLOURS = {"wsi": "#f2c6cf", "wsi.models": "#bfe3bf", "wsi.pipelines": "#bcd3ea", "wsi.configs": "#dddddd"}


def room_of(module: str, path: Path, tops: set[str]) -> str:
    """The room a module lives in: its first-level package, or itself when loose at a folder's top."""
    top = max((t for t in tops if ig.within(module, t)), key=len)
    rest = module[len(top) + 1 :].split(".") if module != top else []
    if not rest:
        return top
    if len(rest) == 1 and path.name != "__init__.py":
        return module  # a loose module at the folder's top
    return f"{top}.{rest[0]}"


def rooms(repo: Path) -> tuple[dict[str, int], dict[str, int], dict[str, set[str]]]:
    """(lines per room, modules per room, room -> rooms it imports)."""
    found = ig.modules(repo)
    tops = set(ig.folders(repo))
    lines: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    owner = {m: room_of(m, p, tops) for m, p in found.items()}
    for m, p in found.items():
        lines[owner[m]] += len(p.read_text(encoding="utf-8").splitlines())
        count[owner[m]] += p.name != "__init__.py"
    # a top folder's own __init__ (re-exports, a front door) is drawn only when it holds code
    shown = {r for r in owner.values() if count[r] or lines[r] > 40}
    links: dict[str, set[str]] = {r: set() for r in shown}
    for m, targets in ig.graph(repo).items():
        for t in targets:
            if t not in ig.parents(m) and owner[t] != owner[m] and owner[m] in shown and owner[t] in shown:
                links[owner[m]].add(owner[t])
    return dict(lines), dict(count), links


def strong_parts(links: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components: rooms that reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    parts: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(links[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on.discard(w)
                part.add(w)
                if w == v:
                    break
            parts.append(part)

    sys.setrecursionlimit(10_000)
    for v in sorted(links):
        if v not in index:
            visit(v)
    return parts


def floors(links: dict[str, set[str]], parts: list[set[str]]) -> dict[str, int]:
    """Floor of each room: one above the highest room it imports (a circle's rooms share a floor)."""
    part_of = {r: i for i, part in enumerate(parts) for r in part}
    memo: dict[int, int] = {}

    def floor(i: int) -> int:
        if i not in memo:
            below = {part_of[t] for r in parts[i] for t in links[r]} - {i}
            memo[i] = 1 + max((floor(j) for j in below), default=-1)
        return memo[i]

    return {r: floor(part_of[r]) for r in links}


def draw(repo: Path, out: Path, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    lines, count, links = rooms(repo)
    parts = strong_parts(links)
    circled = {r for part in parts if len(part) > 1 for r in part}
    level = floors(links, parts)
    n_floors = max(level.values()) + 1
    by_floor: dict[int, list[str]] = defaultdict(list)
    for r, f in level.items():
        by_floor[f].append(r)
    # order each floor by the mean position of what it imports (fewer crossings), bottom up
    x_of: dict[str, float] = {}
    width = 100.0
    for f in range(n_floors):
        names = sorted(
            by_floor[f], key=lambda r: (sum(x_of.get(t, 50) for t in links[r]) / max(len(links[r]), 1), r)
        )
        total = sum(max(lines[r], 150) ** 0.5 for r in names) or 1.0
        x = 0.0
        for r in names:
            w = width * max(lines[r], 150) ** 0.5 / total
            x_of[r] = x + w / 2
            x += w
    fig, ax = plt.subplots(figsize=(16, 1.25 * n_floors + 1.2), dpi=90)
    ax.set_xlim(-1, width + 1)
    ax.set_ylim(-0.6, n_floors)
    ax.axis("off")
    box_h = 0.62
    sizes: dict[str, float] = {}
    for names in by_floor.values():
        total = sum(max(lines[r], 150) ** 0.5 for r in names) or 1.0
        for r in names:
            sizes[r] = width * max(lines[r], 150) ** 0.5 / total
    for r, targets in links.items():
        for t in targets:
            red = r in circled and t in circled and level[r] == level[t]
            ax.add_patch(FancyArrowPatch(
                (x_of[r], level[r] - box_h / 2), (x_of[t], level[t] + box_h / 2),
                arrowstyle="-|>", mutation_scale=7, lw=0.5 if not red else 1.0,
                color="#c0392b" if red else "#999999", alpha=0.35 if not red else 0.8,
                connectionstyle="arc3,rad=0.25" if red else "arc3,rad=0.0",
            ))  # fmt: skip
    for r, f in level.items():
        top = max((t for t in COLOURS if ig.within(r, t)), key=len)
        w = sizes[r] * 0.94
        ax.add_patch(
            Rectangle(
                (x_of[r] - w / 2, f - box_h / 2),
                w,
                box_h,
                facecolor=COLOURS[top],
                edgecolor="#c0392b" if r in circled else "#555555",
                lw=1.2 if r in circled else 0.6,
            )
        )
        short = r.removeprefix("wsi.models.").removeprefix("wsi.pipelines.").removeprefix("wsi.")
        folder = (
            "models/" if r.startswith("wsi.models") else "pipelines/" if r.startswith("wsi.pipelines") else ""
        )
        ax.text(
            x_of[r],
            f + 0.08,
            f"{folder}{short}",
            ha="center",
            va="center",
            fontsize=6.5 if w > 3 else 5,
            rotation=0 if w > 3 else 90,
        )
        if w > 3:
            ax.text(
                x_of[r],
                f - 0.16,
                f"{count[r]} mod, {lines[r] / 1000:.1f}k",
                ha="center",
                va="center",
                fontsize=5.5,
                color="#333333",
            )
    depth = {r: r.count(".") - r.startswith(("wsi.models.", "wsi.pipelines.")) for r in links}
    loose = sum(1 for r in links if depth[r] == 1 and count[r] == 1 and not r.startswith("wsi.configs"))
    arrows = sum(len(t) for t in links.values())
    summary = (f"{len(links)} rooms on {n_floors} floors, {arrows} arrows between rooms, "
               f"{len(circled)} rooms in circles between packages")  # fmt: skip
    legend = "pink: wsi/, green: models/, blue: pipelines/; arrows point down to what a room imports"
    ax.set_title(f"{title}\n{summary}   ({legend}; red: rooms importing each other)", fontsize=9, loc="left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return f"{out}: {summary}; {loose} loose module rooms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repo", type=Path, default=HERE.parent, help="the checkout to draw (default: this one)"
    )
    parser.add_argument("--out", type=Path, default=HERE / "architecture.png")
    parser.add_argument("--title", default="wsi: rooms by job")
    args = parser.parse_args()
    print(draw(args.repo.resolve(), args.out, args.title))


if __name__ == "__main__":
    main()

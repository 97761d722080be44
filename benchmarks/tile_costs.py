"""The tile stage's fixed costs: per step of one slide, and per process against LazySlide (issue 35).

Used by `tile_throughput.py --breakdown` and `--compare`; kept apart so that script stays readable.

breakdown: runs the real stage (`tile_slides`, one slide at a time, in this process, after a warm-up)
with a timer around each step it calls, found by name in the modules that call them, so the table
follows the code without the library carrying timers. A step renamed or removed fails the benchmark
loudly instead of timing nothing.

compare: whole processes, warm, one after the other and alternating: `wsi tile SLIDE --out DIR
--overwrite` (the `wsi` script beside this Python) and LazySlide's `open_wsi`, `pp.find_tissues`,
`pp.tile_tissues(256, mpp=1.0)`, imports included. LazySlide runs only where it is installed (this
Python, or --lazyslide-python); the script never installs it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: (module, function, step): each call of module.function is timed as that step. find_tissue's own
#: share (background, grid, fractions) is what is left of it once its timed callees are taken out.
STEPS = (
    ("wsi.pipelines.tile.stage", "open_with_mpp", "open slide"),
    ("wsi.pipelines.tile.steps", "read_thumbnails", "thumbnail + QC picture read"),
    ("wsi.tiling.grid", "find_tissue_mask", "tissue mask"),
    ("wsi.tiling.grid", "find_artifacts", "artifact regions"),
    ("wsi.pipelines.tile.steps", "find_tissue", "background, grid, cell fractions"),
    ("wsi.pipelines.tile.steps", "filter_tiles", "tile reads + filters"),
    ("wsi.pipelines.tile.steps", "tile_qc_image", "QC picture drawn"),
    ("wsi.pipelines.tile.steps", "save_png", "QC PNG written"),
    ("wsi.pipelines.tile.steps", "write_qc_geojson", "QC GeoJSON written"),
    ("wsi.pipelines.tile.steps", "write_tiles", "tile file written (review applied)"),
)
_NESTED = {"background, grid, cell fractions": ("tissue mask", "artifact regions")}
OTHER = "other (ids, checks, manifest)"
LAZYSLIDE_SCRIPT = """
import sys
import lazyslide as zs
wsi = zs.open_wsi(sys.argv[1])
zs.pp.find_tissues(wsi)
zs.pp.tile_tissues(wsi, 256, mpp=1.0)
print(len(wsi["tiles"]), file=sys.stderr)
"""


@contextlib.contextmanager
def _timers(spent: dict[str, float]) -> Iterator[None]:
    """Wrap every STEPS function so its calls add their wall time to spent[step]."""
    undo: list[tuple[Any, str, Callable[..., Any]]] = []

    def timed(fn: Callable[..., Any], step: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start, start_cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[step] += time.perf_counter() - start
                spent[f"{step} CPU"] += time.process_time() - start_cpu

        return wrapper

    try:
        for module_name, name, step in STEPS:
            module = importlib.import_module(module_name)
            if not callable(getattr(module, name, None)):
                raise SystemExit(f"breakdown: {module_name}.{name} is gone; update STEPS in {__file__}")
            original = getattr(module, name)
            undo.append((module, name, original))
            setattr(module, name, timed(original, step))
        yield
    finally:
        for module, name, original in reversed(undo):
            setattr(module, name, original)


def breakdown(slides: list[Path], *, repeat: int, backend: str = "openslide") -> list[dict[str, Any]]:
    """Median seconds per step of each slide over `repeat` runs (after one untimed), one row each."""
    from wsi.pipelines.tile.stage import tile_slides
    from wsi.slides.sources import find_slides

    rows = []
    with tempfile.TemporaryDirectory(prefix="tile-breakdown-") as tmp:
        for path in slides:
            source = find_slides([path])
            tile_slides(source, out_dir=tmp, backend=backend, overwrite=True)  # warm: page cache, imports
            runs: list[dict[str, float]] = []
            for _ in range(repeat):
                spent: dict[str, float] = defaultdict(float)
                with _timers(spent):
                    start, start_cpu = time.perf_counter(), time.process_time()
                    res = tile_slides(source, out_dir=tmp, backend=backend, overwrite=True)
                    spent["total"] = time.perf_counter() - start
                    spent["total CPU"] = time.process_time() - start_cpu
                if res[0].status != "ok":
                    raise SystemExit(f"breakdown: {path}: {res[0].status}: {res[0].error}")
                for suffix in ("", " CPU"):
                    for outer, inner in _NESTED.items():
                        spent[outer + suffix] -= sum(spent[step + suffix] for step in inner)
                    timed = sum(spent[step + suffix] for _, _, step in STEPS)
                    spent[OTHER + suffix] = spent["total" + suffix] - timed
                runs.append(dict(spent))
            row: dict[str, Any] = {"slide": path.name, "tiles": res[0].n}
            row.update({key: statistics.median(r.get(key, 0.0) for r in runs) for key in runs[0]})
            rows.append(row)
    return rows


def table(header: list[str], rows: list[list[Any]]) -> None:
    """Print a markdown table."""
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def print_breakdown(rows: list[dict[str, Any]], import_s: float) -> None:
    """ms per step, wall and CPU (all threads of this process: the tile reads and filters run on
    several, every other step on one)."""
    steps = [step for _, _, step in STEPS] + [OTHER, "total"]
    header = ["step"] + [f"{r['slide']} ({r['tiles']} kept): wall / CPU ms" for r in rows]
    ms = [[f"{1000 * r[step]:.0f} / {1000 * r[f'{step} CPU']:.0f}" for r in rows] for step in steps]
    table(header, [[step, *cells] for step, cells in zip(steps, ms, strict=True)])
    print(f"\n(import of the tile stage in a fresh process: {import_s:.2f} s; not in the table)")


def import_seconds(repeat: int) -> float:
    """Median wall seconds of `import wsi.pipelines.tile.stage` in a fresh Python (after one untimed)."""
    code = "\n".join(
        [
            "import time",
            "t = time.perf_counter()",
            "import wsi.pipelines.tile.stage",
            "print(time.perf_counter() - t)",
        ]
    )
    env = _compiled_env()
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
            for _ in range(repeat + 1)][1:]  # fmt: skip
    return statistics.median(float(run.stdout) for run in runs)


# ------------------------------------------------------------------------------------------- compare
def lazyslide_python(given: str | None) -> str | None:
    """The Python that has LazySlide (the one given, else this one), or None when neither has it."""
    python = given or sys.executable
    probe = subprocess.run(
        [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('lazyslide') is None)"],
        capture_output=True,
    )  # fmt: skip
    return python if probe.returncode == 0 else None


def _wsi_command(python: str | None = None) -> list[str]:
    """The `wsi` script beside `python` (this one by default)."""
    python = python or sys.executable
    script = Path(python).parent / "wsi"
    return [str(script)] if script.exists() else [python, "-c", "from wsi.cli.main import cli; cli()"]


def _compiled_env() -> dict[str, str]:
    """This environment, with compiled modules kept: without PYTHONDONTWRITEBYTECODE (set in some
    sandboxes, it makes every run of an editable install compile its sources again, ~0.1-0.3 s, which no
    installed copy does), and with PYTHONPYCACHEPREFIX in a temporary folder, so no .pyc is written
    beside anybody's sources (the baseline's checkout included)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "wsi-benchmarks-pycache"))
    return env


def _run(cmd: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the child and its threads) of one whole process, warm (compiled, `_compiled_env`);
    raises if it fails."""
    env = _compiled_env()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"compare: {' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def compare(
    slides: list[Path], *, repeat: int, python: str | None, baseline: str | None = None
) -> list[dict[str, Any]]:
    """Whole-process wall and CPU seconds, medians of `repeat` rounds (order alternating) after one
    warm-up each: `wsi tile`, the `wsi tile` of another checkout's Python (`baseline`, e.g. the main
    branch: before and after in one run) and LazySlide (`python`), where given."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="tile-compare-") as tmp:
        for slide in slides:
            args = ["tile", str(slide), "--overwrite", "--out"]
            tools = {"wsi tile": [*_wsi_command(), *args, f"{tmp}/new"]}
            if baseline is not None:
                tools["baseline"] = [*_wsi_command(baseline), *args, f"{tmp}/old"]
            if python is not None:
                tools["LazySlide"] = [python, "-c", LAZYSLIDE_SCRIPT, str(slide)]
            for cmd in tools.values():
                _run(cmd)  # warm: page cache, .pyc files
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
            for i in range(repeat):
                order = list(tools) if i % 2 == 0 else list(reversed(tools))
                for name in order:
                    times[name].append(_run(tools[name]))
            row: dict[str, Any] = {"slide": slide.name, "load": round(os.getloadavg()[0], 1)}
            for name, runs in times.items():
                row[f"{name} wall s"] = round(statistics.median(w for w, _ in runs), 2)
                row[f"{name} CPU s"] = round(statistics.median(c for _, c in runs), 2)
                row[f"{name} wall runs"] = " ".join(f"{w:.2f}" for w, _ in runs)
            for other in ("LazySlide", "baseline"):
                if other in times:  # median of the per-round ratios: each round ran both under one load
                    pairs = list(zip(times["wsi tile"], times[other], strict=True))
                    row[f"wsi/{other} wall"] = round(statistics.median(a[0] / b[0] for a, b in pairs), 2)
                    row[f"wsi/{other} CPU"] = round(statistics.median(a[1] / b[1] for a, b in pairs), 2)
            rows.append(row)
            shutil.rmtree(tmp, ignore_errors=True)
    return rows


def print_compare(rows: list[dict[str, Any]], have_lazyslide: bool) -> None:
    tools = [t for t in ("wsi tile", "baseline", "LazySlide") if f"{t} wall s" in rows[0]]
    if not have_lazyslide:
        print("\nLazySlide is not installed here (nor given with --lazyslide-python): wsi tile only")
    header = ["slide"] + [f"{t} {what}" for what in ("wall s", "CPU s") for t in tools]
    header += [f"wsi/{t} {what}" for t in ("LazySlide", "baseline") if t in tools for what in ("wall", "CPU")]
    table([*header, "load"], [[r[h] for h in header] + [r["load"]] for r in rows])
    for r in rows:
        print(f"  {r['slide']}: wall s per run: " + "; ".join(f"{t} {r[f'{t} wall runs']}" for t in tools))


def make_slides_8mm(cache: Path) -> Path:
    """The issue's generated slide: `wsi make-slides --size-um 8000 --n 1` (cached)."""
    folder = cache / "make-slides-8000"
    slide = folder / "sample-000.svs"
    if not slide.exists():
        cmd = [*_wsi_command(), "make-slides", "--out", str(folder), "--size-um", "8000", "--n", "1"]
        subprocess.run(cmd, check=True, capture_output=True)
    return slide

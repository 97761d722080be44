"""How high stage/raw can go at all: the tile stage with parts of its work taken out (issue 35).

Used by `tile_throughput.py --ceiling`; kept apart so that script stays readable.

The stage is run as it is and as three counterfactuals, in this process (one worker), on the same
slides and alternating with the raw read:

  no filters  the read-and-filter step replaced by the read alone, every tile kept (what any filter
              implementation, however cheap, would cost nothing above);
  no QC       the QC picture, its PNG and the QC GeoJSON not made (the tile file is still written);
  neither     both: the read, the thumbnails, tissue mask, artifact regions and grid, and the tile file.

"neither" is the stage's ceiling: no filter code and no QC writer can make the stage cheaper than it,
so if raw / neither is under a goal, that goal cannot be met by faster filters or QC. The
counterfactuals replace functions by name in the modules that call them (as `tile_costs.py` times
them), so a renamed step fails the benchmark loudly instead of measuring nothing. They are measuring
devices only: the library has no switch for them.
"""

from __future__ import annotations

import contextlib
import importlib
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: the counterfactuals: name -> (filters on, QC on)
VARIANTS = {
    "stage": (True, True), "no filters": (False, True), "no QC": (True, False), "neither": (False, False),
}  # fmt: skip


def _reads_only(slide: Any, coords: np.ndarray, params: Any, threads: int, **_: Any) -> Iterator[Any]:
    """`classified_chunks` without the filters: the same reads, every tile KEPT."""
    from wsi.pipelines.tile.read import read_tile_chunks
    from wsi.tiling.grid import KEPT

    for tiles in read_tile_chunks(slide, coords, params, threads):
        yield tiles, np.full(len(tiles), KEPT, np.int8)


def _no_picture(*_: Any, **__: Any) -> np.ndarray:
    return np.zeros((1, 1, 3), np.uint8)


def _touch(path: Path, *_: Any, **__: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).touch()  # the stage only needs the file to exist (a later resume checks for it)


def _nothing(*_: Any, **__: Any) -> None:
    return None


@contextlib.contextmanager
def variant(filters: bool, qc: bool) -> Iterator[None]:
    """The stage with its filters and/or QC outputs replaced, for the duration of the block."""
    swaps: list[tuple[str, str, Callable[..., Any]]] = []
    if not filters:
        swaps.append(("wsi.pipelines.tile.filters", "classified_chunks", _reads_only))
    if not qc:
        swaps += [
            ("wsi.pipelines.tile.steps", "tile_qc_image", _no_picture),
            ("wsi.pipelines.tile.steps", "save_png", _touch),
            ("wsi.pipelines.tile.steps", "write_qc_geojson", _nothing),
        ]  # fmt: skip
    undo: list[tuple[Any, str, Any]] = []
    try:
        for module_name, name, replacement in swaps:
            module = importlib.import_module(module_name)
            if not callable(getattr(module, name, None)):
                raise SystemExit(f"ceiling: {module_name}.{name} is gone; update {__file__}")
            undo.append((module, name, getattr(module, name)))
            setattr(module, name, replacement)
        yield
    finally:
        for module, name, original in reversed(undo):
            setattr(module, name, original)


def measure(
    sources: list[Any], coords: np.ndarray, *, out: Path, repeat: int, threads: int
) -> dict[str, Any]:
    """Median wall and CPU seconds of raw and of each variant over `repeat` alternating rounds (one
    worker: everything runs in this process, so its CPU time is the work done), after a warm-up."""
    import functools

    from _tile_reads import raw_read  # beside this script
    from wsi.pipelines.scheduling.jobs import run_jobs
    from wsi.pipelines.tile.stage import tile_slides

    read = functools.partial(raw_read, coords=coords, backend="openslide", threads=threads)
    run_jobs(sources, read, workers=1, desc="warm-up")
    tile_slides(sources, out_dir=out, threads=threads, overwrite=True)
    wall: dict[str, list[float]] = {name: [] for name in ["raw", *VARIANTS]}
    cpu: dict[str, list[float]] = {name: [] for name in wall}
    kept: dict[str, int] = {}
    for _ in range(repeat):
        for name in wall:
            start, start_cpu = time.perf_counter(), time.process_time()
            if name == "raw":
                res = run_jobs(sources, read, workers=1, desc=name)
            else:
                with variant(*VARIANTS[name]):
                    res = tile_slides(sources, out_dir=out, threads=threads, overwrite=True)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            if any(r.status != "ok" for r in res):
                raise SystemExit(f"ceiling: {name} failed: {[r.error for r in res if r.error]}")
            kept[name] = sum(r.n for r in res)
    n = len(coords) * len(sources)
    row: dict[str, Any] = {"tiles_read": n}
    for name in wall:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        row[name] = {"wall_s": round(w, 3), "cpu_ms_per_tile": round(1e3 * c / n, 3), "kept": kept[name]}
    raw_w, raw_c = row["raw"]["wall_s"], row["raw"]["cpu_ms_per_tile"]
    for name in VARIANTS:
        row[name]["raw_over_wall"] = round(raw_w / row[name]["wall_s"], 2)
        row[name]["raw_over_cpu"] = round(raw_c / row[name]["cpu_ms_per_tile"], 2)
    return row


def print_ceiling(row: dict[str, Any]) -> None:
    print("\n| run | filters | QC outputs | kept | wall s | CPU ms/tile | raw/run (wall) | raw/run (CPU) |")
    print("|---|---|---|---|---|---|---|---|")
    raw = row["raw"]
    n = row["tiles_read"]
    print(f"| raw read | - | - | {n} read | {raw['wall_s']} | {raw['cpu_ms_per_tile']} | 1 | 1 |")
    for name, (filters, qc) in VARIANTS.items():
        r = row[name]
        on = {True: "on", False: "off"}
        print(f"| {name} | {on[filters]} | {on[qc]} | {r['kept']} | {r['wall_s']} | {r['cpu_ms_per_tile']} "
              f"| {r['raw_over_wall']} | {r['raw_over_cpu']} |")  # fmt: skip

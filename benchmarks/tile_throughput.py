"""Tile-stage throughput next to the raw read rate of the same tiles.

Builds (and caches) a large generated slide, by default 10 x 10 mm at 0.25 um/px (40,000 x 40,000 px),
painted with real H&E pixels when ../shared/data/slides is present, and links it under several slide
names so that slide-level parallelism has work. For each backend and worker count it times

  raw    reading every tissue-candidate tile once with Slide.read_region_um (no filtering, no output),
         through the same batch runner and reader threads as the stage;
  raw (painted)  the same through openslide's own read_region (open_slide(direct_jpeg=False): what
         wsi read with before it decoded Aperio/TIFF JPEG tiles itself, `wsi.slides.stored_tiles`);
  stage  the whole tile stage (thumbnail, tissue mask, artifact regions, grid, reads, background, blur
         and artifact filters, QC image and GeoJSON, tile file) with --overwrite,

and prints tiles per second and the ratios (medians of --repeat alternating runs), so the cost of
detection and filtering shows.
With --filters it instead times the stage with the artifact filters (wsi.tiling.artifacts) on and off, side
by side (alternating runs, best of --repeat each), and prints their ratio: what the filters cost.

With --ceiling it times the stage (one worker) as it is and with its filters and/or QC outputs taken
out (`tile_ceiling.py`), beside the raw read: the highest stage/raw that faster filters or QC could give.

With --breakdown it times each per-slide step of the stage (open, thumbnail, tissue mask, artifact
regions, tile reads + filters, QC picture, GeoJSON, tile file; `tile_costs.py`) on CMU-1-Small-Region
(../shared/data) and a generated 8 mm slide, or on --slide; with --compare it times whole processes,
`wsi tile` against LazySlide where LazySlide is installed (it installs nothing).

    python benchmarks/tile_throughput.py            # full size
    python benchmarks/tile_throughput.py --quick    # 2 x 2 mm, seconds
    python benchmarks/tile_throughput.py --filters  # artifact filters on vs off
    python benchmarks/tile_throughput.py --slides 4 --backends openslide --workers 1 --no-painted  # stage/raw
    python benchmarks/tile_throughput.py --breakdown --repeat 5   # per-slide fixed costs, ms per step
    python benchmarks/tile_throughput.py --compare --repeat 5 --lazyslide-python /tmp/lzs/bin/python
    python benchmarks/tile_throughput.py --ceiling --slides 4 --repeat 3   # filters/QC taken out
"""

from __future__ import annotations

import argparse
import csv
import functools
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from _machine import cpu_model  # benchmarks/_machine.py, beside this script
from _tile_reads import raw_read  # benchmarks/_tile_reads.py: shared with tile_ceiling.py
from wsi.pipelines.scheduling.cluster import close_local_cluster, start_local_cluster
from wsi.pipelines.scheduling.jobs import run_jobs
from wsi.pipelines.tile.stage import default_threads, tile_slides
from wsi.slides.slide import open_slide
from wsi.slides.sources import SlideSource, find_slides
from wsi.synthetic import write_sample_slide
from wsi.tiling.artifacts import ArtifactParams
from wsi.tiling.grid import find_tissue
from wsi.tiling.params import TileParams


def build_slides(cache: Path, *, size_um: float, mpp: float, n_slides: int) -> list[SlideSource]:
    """One cached sample slide, linked under `n_slides` names."""
    cache.mkdir(parents=True, exist_ok=True)
    master = cache / f"bench-{size_um:g}um-{mpp:g}mpp.svs"
    if not master.exists():
        print(f"writing {master} ({round(size_um / mpp)} px square; cached for later runs) ...", flush=True)
        start = time.perf_counter()
        sample = write_sample_slide(master, size_um=size_um, mpp=mpp, texture="auto", seed=0)
        print(f"  done in {time.perf_counter() - start:.0f} s, texture: {sample.texture}", flush=True)
    folder = cache / f"links-{master.stem}-{n_slides}"
    folder.mkdir(exist_ok=True)
    for i in range(n_slides):
        link = folder / f"slide-{i}.svs"
        if not link.exists():
            link.symlink_to(master)
    return find_slides([folder])


def candidate_coords(source: SlideSource, params: TileParams) -> np.ndarray:
    """The tissue-candidate tiles the stage reads (same mask and grid code as the stage)."""
    with open_slide(source.path) as slide:
        return find_tissue(slide, params).candidate_coords


def _measure(
    sources: list[SlideSource],
    coords: np.ndarray,
    *,
    backend: str,
    workers: int,
    out: Path,
    repeat: int = 1,
    painted: bool = True,
) -> dict:
    """Raw reads, then the stage, on the same warmed-up workers (a LocalCluster started once and timed
    apart), so the rates compare work, not process start-up or imports. Medians of `repeat` rounds."""
    threads = default_threads(workers)
    n_read = len(coords) * len(sources)
    cluster = None
    scheduler = None
    start = time.perf_counter()
    if workers > 1:
        cluster = start_local_cluster(workers)  # the same cluster run_jobs(workers=N) starts
        scheduler = cluster.scheduler_address
    startup_s = time.perf_counter() - start
    readers = {"raw": functools.partial(raw_read, coords=coords, backend=backend, threads=threads)}
    if backend == "openslide" and painted:
        readers["painted"] = functools.partial(readers["raw"], direct_jpeg=False)
    times: dict[str, list[float]] = {name: [] for name in [*readers, "stage"]}
    # with one worker everything runs in this process: its CPU time (all threads) is the work done,
    # which the machine's other jobs slow down far less than the wall time
    cpu: dict[str, list[float]] = {name: [] for name in times}
    try:
        # warm-up, untimed: imports in fresh workers, the page cache, the output folder
        run_jobs(sources, readers["raw"], workers=workers, scheduler=scheduler, desc="warm-up")
        tile_slides(
            sources, out_dir=out, backend=backend, workers=workers, scheduler=scheduler, threads=threads
        )
        for _ in range(repeat):  # the machine is shared and noisy: rounds of each, medians kept
            for name, fn in readers.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                raw = run_jobs(sources, fn, workers=workers, scheduler=scheduler, desc=name)
                times[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
                if any(r.status != "ok" for r in raw):
                    raise SystemExit(f"{name} read failed: {[r.error for r in raw if r.error]}")
            start, start_cpu = time.perf_counter(), time.process_time()
            res = tile_slides(
                sources, out_dir=out, backend=backend, workers=workers, scheduler=scheduler, overwrite=True,
                threads=threads,
            )  # fmt: skip
            times["stage"].append(time.perf_counter() - start)
            cpu["stage"].append(time.process_time() - start_cpu)
            if any(r.status != "ok" for r in res):
                raise SystemExit(f"tile stage failed: {[r.error for r in res if r.error]}")
    finally:
        if cluster is not None:
            close_local_cluster(cluster)
    med = {name: statistics.median(t) for name, t in times.items()}
    med_cpu = {name: statistics.median(t) for name, t in cpu.items()}
    painted = med.get("painted")
    in_process = workers == 1  # else the work is in the workers' processes, not counted here
    return {
        "backend": backend, "workers": workers, "threads": threads, "slides": len(sources),
        "tiles_read": n_read, "kept": sum(r.n for r in res), "cluster_start_s": round(startup_s, 2),
        "raw_s": round(med["raw"], 2), "painted_s": round(painted, 2) if painted else None,
        "stage_s": round(med["stage"], 2),
        "raw_tiles_per_s": round(n_read / med["raw"], 1),
        "painted_tiles_per_s": round(n_read / painted, 1) if painted else None,
        "stage_tiles_per_s": round(n_read / med["stage"], 1),
        "stage_over_raw": round(med["raw"] / med["stage"], 2),
        "stage_over_painted": round(painted / med["stage"], 2) if painted else None,
        "raw_cpu_ms_per_tile": round(1e3 * med_cpu["raw"] / n_read, 3) if in_process else None,
        "stage_cpu_ms_per_tile": round(1e3 * med_cpu["stage"] / n_read, 3) if in_process else None,
        "stage_over_raw_cpu": round(med_cpu["raw"] / med_cpu["stage"], 2) if in_process else None,
        "load": round(os.getloadavg()[0], 1),
    }  # fmt: skip


def _measure_filters(
    sources: list[SlideSource], n_tiles: int, *, backend: str, workers: int, out: Path, repeat: int
) -> dict:
    """The whole stage with the artifact filters on (the defaults) and off, alternating, best of
    `repeat` each, on the same warmed-up workers. With one worker the stage runs in this process, so
    its CPU time (all threads) is measured too: on a machine shared with other jobs, wall time swings
    by 2x between runs while CPU time stays put."""
    threads = default_threads(workers)
    cluster = start_local_cluster(workers) if workers > 1 else None
    scheduler = cluster.scheduler_address if cluster is not None else None
    settings = {"on": TileParams(), "off": TileParams(artifacts=ArtifactParams(filters=()))}
    best = dict.fromkeys(settings, float("inf"))
    cpu = dict.fromkeys(settings, float("inf"))
    kept = dict.fromkeys(settings, 0)
    try:
        tile_slides(
            sources, out_dir=out, backend=backend, workers=workers, scheduler=scheduler, threads=threads
        )
        for _ in range(repeat):
            for name, params in settings.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                res = tile_slides(
                    sources, out_dir=out, params=params, backend=backend, workers=workers,
                    scheduler=scheduler, overwrite=True, threads=threads,
                )  # fmt: skip
                best[name] = min(best[name], time.perf_counter() - start)
                cpu[name] = min(cpu[name], time.process_time() - start_cpu)
                if any(r.status != "ok" for r in res):
                    raise SystemExit(f"tile stage failed: {[r.error for r in res if r.error]}")
                kept[name] = sum(r.n for r in res)
    finally:
        if cluster is not None:
            close_local_cluster(cluster)
    n = n_tiles * len(sources)
    return {
        "backend": backend, "workers": workers, "threads": threads, "tiles": n, "kept_on": kept["on"],
        "kept_off": kept["off"], "off_s": round(best["off"], 2), "on_s": round(best["on"], 2),
        "off_tiles_per_s": round(n / best["off"], 1), "on_tiles_per_s": round(n / best["on"], 1),
        "on_over_off": round(best["off"] / best["on"], 3),
        "off_cpu_s": round(cpu["off"], 2) if workers == 1 else None,
        "on_cpu_s": round(cpu["on"], 2) if workers == 1 else None,
        "cpu_on_over_off": round(cpu["off"] / cpu["on"], 3) if workers == 1 else None,
    }  # fmt: skip


def _filters_table(rows: list[dict]) -> None:
    print("\n| backend | workers | tiles | kept (on / off) | off tiles/s | on tiles/s | on/off "
          "| CPU s off / on | CPU on/off |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['workers']} | {r['tiles']} | {r['kept_on']} / {r['kept_off']} | "
              f"{r['off_tiles_per_s']} | {r['on_tiles_per_s']} | {r['on_over_off']} | {r['off_cpu_s']} / "
              f"{r['on_cpu_s']} | {r['cpu_on_over_off']} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 x 2 mm slide instead of 10 x 10 mm")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="folder for tile_throughput.csv")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "wsi-benchmarks",
                        help="where the generated slide is kept between runs")  # fmt: skip
    parser.add_argument("--size-um", type=float, default=None, help="slide side in um (default 10000)")
    parser.add_argument("--mpp", type=float, default=0.25, help="level-0 um/px of the generated slide")
    parser.add_argument("--slides", type=int, default=2, help="slide names (links to one file)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--backends", nargs="+", default=["openslide", "tiffslide"])
    parser.add_argument("--repeat", type=int, default=None, help="timed runs, best kept (default 3, quick 1)")
    parser.add_argument("--device", default=None, help="accepted for uniformity; tiling runs on the CPU")
    parser.add_argument("--filters", action="store_true", help="time the artifact filters: stage on vs off")
    parser.add_argument("--no-painted", action="store_true",
                        help="skip the raw read through openslide's painting (the slowest)")  # fmt: skip
    parser.add_argument("--breakdown", action="store_true", help="ms per step of one slide (fixed costs)")
    parser.add_argument("--compare", action="store_true", help="whole process: wsi tile against LazySlide")
    parser.add_argument("--ceiling", action="store_true",
                        help="stage/raw with filters and/or QC outputs taken out (one worker)")  # fmt: skip
    parser.add_argument("--slide", type=Path, nargs="+", default=None,
                        help="slides for --breakdown/--compare (default: CMU-1-Small-Region, generated 8 mm)")
    parser.add_argument("--lazyslide-python", default=None,
                        help="a Python that has LazySlide, for --compare (default: this one)")
    parser.add_argument("--baseline-python", default=None,
                        help="--compare: also time this Python's wsi (another checkout)")  # fmt: skip
    args = parser.parse_args()
    if args.breakdown or args.compare:
        _fixed_costs(args)
        return
    logging.basicConfig(level=logging.WARNING)
    import distributed  # noqa: F401  (sets its own log levels on import; quiet them afterwards)

    logging.getLogger("distributed").setLevel(logging.WARNING)

    size_um = args.size_um or (2048.0 if args.quick else 10_000.0)
    repeat = args.repeat or (1 if args.quick else 3)
    sources = build_slides(args.cache, size_um=size_um, mpp=args.mpp, n_slides=args.slides)
    params = TileParams()
    coords = candidate_coords(sources[0], params)
    px = round(size_um / args.mpp)
    print(f"slide {px} x {px} px at {args.mpp} um/px, {len(sources)} slides, {len(coords)} tissue tiles "
          f"each; {os.cpu_count()} CPUs ({cpu_model()})")  # fmt: skip

    rows = []
    if args.ceiling:
        import tile_ceiling  # benchmarks/tile_ceiling.py, beside this script

        with tempfile.TemporaryDirectory(prefix="tile-bench-") as tmp:
            row = tile_ceiling.measure(
                sources, coords, out=Path(tmp), repeat=repeat, threads=default_threads(1)
            )  # fmt: skip
        print(row, flush=True)
        tile_ceiling.print_ceiling(row)
        print(f"(load average {os.getloadavg()[0]:.1f} at the end)")
        return
    if args.filters:
        with tempfile.TemporaryDirectory(prefix="tile-bench-") as tmp:
            for backend in args.backends:
                for workers in args.workers:
                    row = _measure_filters(
                        sources, len(coords), backend=backend, workers=workers, out=Path(tmp), repeat=repeat
                    )
                    rows.append(row)
                    print(row, flush=True)
        _filters_table(rows)
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "tile_filters_cost.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        return
    with tempfile.TemporaryDirectory(prefix="tile-bench-") as tmp:
        for backend in args.backends:
            for workers in args.workers:
                row = _measure(
                    sources, coords, backend=backend, workers=workers, out=Path(tmp), repeat=repeat,
                    painted=not args.no_painted,
                )  # fmt: skip
                rows.append(row)
                print(rows[-1], flush=True)

    header = ("| backend | workers | threads | tiles read | kept | raw tiles/s | raw (painted) tiles/s "
              "| stage tiles/s | stage/raw | stage/raw (painted) | CPU ms/tile raw / stage | stage/raw (CPU) "
              "| load |")  # fmt: skip
    print("\n" + header + "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cpu = f"{r['raw_cpu_ms_per_tile']} / {r['stage_cpu_ms_per_tile']}" if r["workers"] == 1 else "-"
        print(f"| {r['backend']} | {r['workers']} | {r['threads']} | {r['tiles_read']} | {r['kept']} | "
              f"{r['raw_tiles_per_s']} | {r['painted_tiles_per_s'] or '-'} | {r['stage_tiles_per_s']} | "
              f"{r['stage_over_raw']} | {r['stage_over_painted'] or '-'} | {cpu} | "
              f"{r['stage_over_raw_cpu'] or '-'} | {r['load']} |")  # fmt: skip
    starts = [r["cluster_start_s"] for r in rows if r["workers"] > 1]
    if starts:
        print(f"(LocalCluster start-up, not in the rates: {min(starts)}-{max(starts)} s)")
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "tile_throughput.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _fixed_costs(args: argparse.Namespace) -> None:
    """--breakdown and --compare (tile_costs.py)."""
    import tile_costs  # benchmarks/tile_costs.py, beside this script

    logging.basicConfig(level=logging.WARNING)
    repeat = args.repeat or 5
    slides = args.slide
    if slides is None:
        shared = Path(__file__).resolve().parents[1].parent / "shared" / "data"  # tests' ../shared/data
        cmu = shared / "slides" / "CMU-1-Small-Region.svs"
        slides = ([cmu] if cmu.exists() else []) + [tile_costs.make_slides_8mm(args.cache)]
    print(f"{os.cpu_count()} CPUs ({cpu_model()}), load average {os.getloadavg()[0]:.1f} at the start; "
          f"medians of {repeat} runs")  # fmt: skip
    if args.breakdown:
        rows = tile_costs.breakdown(slides, repeat=repeat, backend=args.backends[0])
        tile_costs.print_breakdown(rows, tile_costs.import_seconds(repeat))
    if args.compare:
        python = tile_costs.lazyslide_python(args.lazyslide_python)
        rows = tile_costs.compare(slides, repeat=repeat, python=python, baseline=args.baseline_python)
        tile_costs.print_compare(rows, python is not None)


if __name__ == "__main__":
    main()

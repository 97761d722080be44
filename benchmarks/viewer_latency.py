"""DeepZoom tile latency of `wsi view` on a 20,000 px slide, on the CPU, through the real HTTP server.

Builds (and caches) a generated slide, 20,000 x 20,000 px at 0.5 um/px (10 x 10 mm), in a `wsi tile`-
shaped folder, starts `wsi view`'s server in this process on 127.0.0.1 and asks it for DeepZoom tiles
over HTTP as OpenSeadragon does, for each backend:

  open       the first `.dzi` request: opening the slide and making its generator (once per slide)
  1 client   random tiles one after another, at full resolution and at 1/4 and 1/16 of it
  8 clients  the same, 8 requests in flight at once (a browser keeps about 6): latency under load,
             and tiles per second

and prints the median and 95th percentile of each. Every tile is a distinct random address, so no
cache helps (the server keeps none; the OS page cache holds the file after the first pass).

    python benchmarks/viewer_latency.py --out /tmp/viewer-bench             # 20,000 px
    python benchmarks/viewer_latency.py --out /tmp/viewer-bench --size-px 4000   # seconds
"""

from __future__ import annotations

import argparse
import csv
import http.client
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from _machine import cpu_model  # benchmarks/_machine.py, beside this script
from wsi.synthetic import write_sample_slide
from wsi.view import make_server
from wsi.view.dzi import OVERLAP, TILE_SIZE


def build_folder(out: Path, size_px: int, mpp: float) -> Path:
    """A folder with one cached slide and a manifest naming it (what `wsi tile` writes)."""
    folder = out / f"view-{size_px}px"
    slide = folder / "slide.svs"
    if not slide.exists():
        folder.mkdir(parents=True, exist_ok=True)
        print(f"writing {slide} ({size_px} px square; cached for later runs) ...", flush=True)
        start = time.perf_counter()
        write_sample_slide(slide, size_um=size_px * mpp, mpp=mpp, texture="auto", seed=0)
        print(f"  done in {time.perf_counter() - start:.0f} s", flush=True)
    with open(folder / "manifest.csv", "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["slide", "path", "status"], ["slide", str(slide), "ok"]])
    return folder


def fetch(port: int, path: str) -> tuple[float, int]:
    """(seconds, bytes) of one GET on a new connection, as the page's image loader makes them."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        body = res.read()
        if res.status != 200:
            raise RuntimeError(f"{path}: HTTP {res.status}")
    finally:
        conn.close()
    return time.perf_counter() - start, len(body)


def addresses(size_px: int, level_offset: int, n: int, rng: random.Random) -> list[str]:
    """n distinct random tile URLs of the DeepZoom level `level_offset` below full resolution."""
    top = math.ceil(math.log2(size_px))
    level = top - level_offset
    side = math.ceil(size_px / 2**level_offset)
    tiles = math.ceil(side / TILE_SIZE)
    picks = rng.sample(range(tiles * tiles), min(n, tiles * tiles))
    return [f"/slides/slide_files/{level}/{i % tiles}_{i // tiles}.jpeg" for i in picks]


def stats(seconds: list[float]) -> tuple[float, float]:
    ms = np.asarray(seconds) * 1000
    return float(np.median(ms)), float(np.percentile(ms, 95))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="cache folder for the generated slide")
    ap.add_argument("--size-px", type=int, default=20_000)
    ap.add_argument("--mpp", type=float, default=0.5)
    ap.add_argument("--tiles", type=int, default=200, help="tiles per measurement")
    ap.add_argument("--backends", default="openslide,tiffslide")
    args = ap.parse_args()
    folder = build_folder(args.out, args.size_px, args.mpp)
    print(
        f"# CPU: {cpu_model()}; slide {args.size_px} x {args.size_px} px; "
        f"tiles {TILE_SIZE}+2x{OVERLAP} px JPEG"
    )
    print("| backend | level | clients | tiles | median ms | p95 ms | tiles/s | KiB/tile |")
    print("|---|---|---|---|---|---|---|---|")
    for backend in args.backends.split(","):
        server = make_server(folder, port=0, backend=backend, workers=8)
        port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            seconds, _ = fetch(port, "/slides/slide.dzi")
            print(f"| {backend} | open (.dzi) | 1 | 1 | {seconds * 1000:.1f} | | | |", flush=True)
            rng = random.Random(0)
            for offset, label in ((0, "full"), (2, "1/4"), (4, "1/16")):
                for clients in (1, 8):
                    urls = addresses(args.size_px, offset, args.tiles, rng)
                    start = time.perf_counter()
                    with ThreadPoolExecutor(clients) as pool:
                        results = list(pool.map(fetch, [port] * len(urls), urls))
                    wall = time.perf_counter() - start
                    med, p95 = stats([s for s, _ in results])
                    kib = np.mean([b for _, b in results]) / 1024
                    print(f"| {backend} | {label} | {clients} | {len(urls)} | {med:.1f} | {p95:.1f} | "
                          f"{len(urls) / wall:.0f} | {kib:.0f} |", flush=True)  # fmt: skip
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    main()

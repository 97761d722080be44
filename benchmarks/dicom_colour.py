"""What the colour fix of a mislabelled DICOM series costs (issue 29, item 4).

Builds two DICOM WSI series of the same real pixels (CMU-1-Small-Region.svs, 2220 x 2967 px at 0.499 um/px,
plus a 4x smaller level): JFIF (YCbCr 4:2:0) frames labelled `YBR_FULL_422` (right: openslide converts)
and labelled `RGB` (wrong: `wsi.slides.slide_colour` converts openslide's raw Y'CbCr with libjpeg-turbo's
integer arithmetic). Then, alternating the two series round by round so that load on the machine hits both
alike:

  open      open_slide on a fresh copy (the colour check reads every file's header and one frame each),
            beside openslide's own open of it
  tile      read_region_um of 256 um tiles at 1.0 um/px (256 px, level 0), 0.5 um/px (512 px, level 0)
            and 2.0 um/px (128 px, from level 1, resampled)

and prints the median CPU milliseconds of each (process time: the machine is shared, and CPU time is what
the fix adds) and the ratio mislabelled / labelled.

    python benchmarks/dicom_colour.py --out /tmp/dicom-colour-bench
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

from _machine import cpu_model  # benchmarks/_machine.py, beside this script
from wsi.slides.slide import open_slide
from wsi.synthetic.dicom import write_dicom_series

SERIES = {"labelled": "YBR_FULL_422", "mislabelled": "RGB"}
TARGETS = (1.0, 0.5, 2.0)  # um/px of 256 um tiles


def build(out: Path, source: Path) -> dict[str, Path]:
    with open_slide(source) as slide:
        level0 = slide.read_level(0, 0, 0, *slide.dimensions)
        mpp = slide.mpp
    levels = [level0, np.asarray(Image.fromarray(level0).reduce(4))]
    folders = {}
    for name, photometric in SERIES.items():
        folder = out / name
        if not (folder / "level0.dcm").exists():
            write_dicom_series(folder, levels, mpp=mpp, photometric=photometric)  # type: ignore[arg-type]
        folders[name] = folder
    return folders


def time_open(folder: Path, scratch: Path, i: int) -> tuple[float, float]:
    """CPU seconds of open_slide on a fresh copy (colour check included), and of openslide's own open."""
    import openslide

    copy = scratch / f"{folder.name}-{i}"
    shutil.copytree(folder, copy)
    start = time.process_time()
    open_slide(copy / "level0.dcm").close()
    ours = time.process_time() - start
    start = time.process_time()
    openslide.OpenSlide(copy / "level0.dcm").close()
    return ours, time.process_time() - start


def time_tiles(folder: Path, target_mpp: float, coords: np.ndarray) -> float:
    """CPU seconds per tile, the slide already open."""
    with open_slide(folder / "level0.dcm") as slide:
        start = time.process_time()
        for x, y in coords:
            slide.read_region_um(int(x), int(y), 256.0, target_mpp)
        return (time.process_time() - start) / len(coords)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the series (kept for reruns)")
    parser.add_argument(
        "--source",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "../shared/data/slides/CMU-1-Small-Region.svs",
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tiles", type=int, default=40, help="tiles per round and target")
    args = parser.parse_args()
    folders = build(args.out, args.source)
    scratch = args.out / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    rng = np.random.default_rng(0)
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        coords = rng.integers(0, [2220 - 513, 2967 - 513], size=(args.tiles, 2))
        order = list(SERIES) if r % 2 == 0 else list(reversed(SERIES))
        for name in order:
            ours, theirs = time_open(folders[name], scratch, r)
            times.setdefault((name, "open_slide"), []).append(ours)
            times.setdefault((name, "openslide.OpenSlide only"), []).append(theirs)
            for target in TARGETS:
                times.setdefault((name, f"{target:g} um/px"), []).append(
                    time_tiles(folders[name], target, coords)
                )
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"machine: {cpu_model()}; {args.rounds} rounds, {args.tiles} tiles per round and target\n")
    print("| read | labelled CPU ms | mislabelled CPU ms (fixed) | ratio |")
    print("|---|---|---|---|")
    for what in ["open_slide", "openslide.OpenSlide only", *(f"{t:g} um/px" for t in TARGETS)]:
        a = statistics.median(times[("labelled", what)]) * 1000
        b = statistics.median(times[("mislabelled", what)]) * 1000
        print(f"| {what} | {a:.2f} | {b:.2f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()

"""Seconds per heatmap PNG (`wsi predict`'s heatmaps/<slide>.png), the thumbnail drawn at full size (as
before) and box-filtered to the PNG's scale first (now), alternating in one process.

The thumbnail is the one `wsi predict` reads (about 2,048 px on the long side) of a real slide, with one
value per 256 um tile on a grid over it (random signed contributions). "full" draws it as it was drawn
before `pipelines.heatmaps._fit` existed (the fit swapped for the identity), "fitted" as now.

    python benchmarks/heatmap_render.py                                   # ../shared/data/slides
    python benchmarks/heatmap_render.py --slide some.svs --repeat 9
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import wsi.pipelines.inputs.heatmaps as heatmaps
from _machine import cpu_model  # benchmarks/_machine.py, beside this script
from wsi.core.errors import MissingMppError
from wsi.slides.slide import open_slide
from wsi.slides.thumbnail import read_thumbnail

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "slides"


def _time(slide: Path, mpp: float | None, fit: bool, out: Path) -> float:
    real = heatmaps._fit
    if not fit:
        heatmaps._fit = lambda image, mpp, longest: (image, mpp)  # type: ignore[assignment]
    try:
        with open_slide(slide, mpp=mpp) as s:
            w, h = s.dimensions
            extent = np.array([w, h]) * s.mpp
        xs, ys = np.meshgrid(np.arange(0, extent[0] - 256, 256.0), np.arange(0, extent[1] - 256, 256.0))
        coords = np.stack([xs.ravel(), ys.ravel()], axis=1)
        values = np.random.default_rng(0).standard_normal(len(coords))
        start = time.perf_counter()
        heatmaps.slide_heatmap((slide, mpp), coords, 256.0, values, out, title=slide.stem)
        return time.perf_counter() - start
    finally:
        heatmaps._fit = real


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slide", type=Path, action="append", help="a slide (default: the shared slides)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mpp", type=float, default=0.25, help="for slides without it (the TCGA crop: 0.25)")
    args = parser.parse_args()
    slides = args.slide or sorted(SHARED.glob("*.svs"))
    if not slides:
        parser.error(f"no slides: give --slide, or put slides in {SHARED}")
    print(f"# heatmap PNG, s per slide (medians of {args.repeat}); {cpu_model()}\n")
    print("| slide | thumbnail px | full s | fitted s | fitted/full |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for slide in slides:
            try:
                with open_slide(slide) as s:
                    mpp = None
            except MissingMppError:
                mpp = args.mpp
            with open_slide(slide, mpp=mpp) as s:
                size = read_thumbnail(s, max(s.dimensions) * s.mpp / 2048.0).image.shape
            _time(slide, mpp, True, Path(tmp) / "warm.png")  # imports, page cache
            full, fitted = [], []
            for _ in range(args.repeat):  # alternating: the machine's load falls on both alike
                full.append(_time(slide, mpp, False, Path(tmp) / "full.png"))
                fitted.append(_time(slide, mpp, True, Path(tmp) / "fitted.png"))
            ratios = [b / a for a, b in zip(full, fitted, strict=True)]
            print(f"| {slide.name} | {size[1]} x {size[0]} | {statistics.median(full):.3f} | "
                  f"{statistics.median(fitted):.3f} | **{statistics.median(ratios):.2f}** |")  # fmt: skip


if __name__ == "__main__":
    main()

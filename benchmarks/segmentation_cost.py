"""Cost of the tile stage's segmentation networks (issue 20): seconds per 512 px window and per slide.

Each network (random weights in its published layout: the cost does not depend on the values) classifies
a batch of 512 px windows on the chosen device; the per-slide cost follows from the number of windows a
slide of the given size needs at the network's resolution (windows of glass alone are skipped by the
tissue networks, windows without tissue by the artifact network), printed for a 15 x 15 mm slide with 50%
tissue.

    python benchmarks/segmentation_cost.py                 # CPU (or the device: --device cuda)
    python benchmarks/segmentation_cost.py --windows 2     # fewer windows, quicker
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _machine import cpu_model  # benchmarks/_machine.py, beside this script
from wsi.models.segmentation import SEGMENTERS, load_segmenter
from wsi.pipelines.scheduling.devices import resolve_device


def _windows_per_slide(mpp: float, side_mm: float, tissue: float, window_px: int = 512) -> int:
    per_side = math.ceil(side_mm * 1000 / (window_px * mpp))
    return max(1, round(per_side * per_side * tissue))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--windows", type=int, default=4, help="windows timed per network")
    ap.add_argument("--side-mm", type=float, default=15.0)
    ap.add_argument("--tissue", type=float, default=0.5, help="share of the slide that is tissue")
    args = ap.parse_args()
    device = resolve_device(args.device)
    names = ("grandqc-tissue", "hest-tissue", "grandqc-artifact", "grandqc-artifact-mpp2")
    rng = np.random.default_rng(0)
    windows = rng.integers(0, 256, (args.windows, 512, 512, 3), dtype=np.uint8)
    where = f"{torch.cuda.get_device_name(device)}" if device.type == "cuda" else f"CPU: {cpu_model()}"
    print(f"# device: {where}, torch threads {torch.get_num_threads()}")
    print(f"{'network':<24}{'um/px':>6}{'s/window':>10}{'windows':>9}{'s/slide':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            spec = SEGMENTERS.get(name)
            path = Path(tmp) / f"{name}.pth"
            torch.save(spec.build().state_dict(), path)
            seg = load_segmenter(name, path, kind=spec.kind, device=device)
            seg.classify(windows[:1])  # warm-up
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            seg.classify(windows)
            if device.type == "cuda":
                torch.cuda.synchronize()
            per = (time.perf_counter() - start) / len(windows)
            n = _windows_per_slide(spec.mpp, args.side_mm, args.tissue)  # glass-only windows are skipped
            print(f"{name:<24}{spec.mpp:>6g}{per:>10.2f}{n:>9}{per * n:>9.0f}")


if __name__ == "__main__":
    main()

"""Make docs/artifacts.png: the tile stage's QC picture of real artifact images, reasons coloured.

Two HistoQC thumbnails (../shared/data/artifacts/histoqc, The Clear BSD License) are written as
one-level slides at 8 um/px and tiled with 256 um tiles (32 px, the thumbnail's own pixels), as
tests/test_artifacts_pipeline.py does: the green-pen slide (ink, orange) and the H&E coverslip-edge
slide (edge, cyan). The two QC pictures are put side by side and scaled to 1200 px wide.

    .venv/bin/python docs/artifacts_picture.py        # writes docs/artifacts.png
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image

from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.sources import SlideSource
from wsi.tile_params import TileParams

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "artifacts" / "histoqc"
NAMES = ("pen__1k_version__pen_green", "coverslip_edge_he__coverslip_edge")
MPP = 8.0


def main() -> None:
    pictures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in NAMES:
            rgb = np.asarray(Image.open(DATA / f"{name}.png").convert("RGB"))
            path = Path(tmp) / f"{name}.tif"
            res = 1e4 / MPP
            tifffile.imwrite(
                path,
                rgb,
                tile=(256, 256),
                photometric="rgb",
                resolution=(res, res),
                resolutionunit="CENTIMETER",
            )
            params = TileParams(tile_um=256.0, tile_px=32, min_blur_variance=0.0)
            sid = name.split("__")[-1]
            tile_slides(
                [SlideSource(sid, path)], out_dir=Path(tmp) / "run", params=params, backend="tiffslide"
            )
            pictures.append(Image.open(output_paths(Path(tmp) / "run", sid).qc).convert("RGB"))
    h = max(p.height for p in pictures)
    canvas = Image.new("RGB", (sum(p.width for p in pictures) + 20, h), (255, 255, 255))
    x = 0
    for p in pictures:
        canvas.paste(p, (x, 0))
        x += p.width + 20
    canvas = canvas.resize((1200, round(canvas.height * 1200 / canvas.width)), Image.Resampling.LANCZOS)
    canvas.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(
        HERE / "artifacts.png", optimize=True
    )
    print(f"wrote {HERE / 'artifacts.png'} ({(HERE / 'artifacts.png').stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()

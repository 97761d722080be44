"""Make docs/artifacts.png: the tile stage's QC picture of real artifact images, reasons coloured.

Three real thumbnails of ../shared/data/artifacts are written as one-level slides and tiled with 256 um
tiles, as tests/pipelines/tile/test_artifacts_pipeline.py does: HistoQC's green-pen slide (ink, blue) and
H&E coverslip-edge slide (edge, yellow), both at 8 um/px (The Clear BSD License), and an MSKCC blood clot with
two black marker circles (lookalikes/ink01, PenAnnotationExtractor, MIT; about 20 um/px): the clot is
kept, the circles are ink. The QC pictures are put side by side and scaled to 1200 px wide.

    .venv/bin/python docs/artifacts_picture.py        # writes docs/artifacts.png
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image

from wsi.pipelines.tile.job import output_paths
from wsi.pipelines.tile.stage import tile_slides
from wsi.slides.sources import SlideSource
from wsi.tiling.params import TileParams

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "artifacts"
#: (file under DATA, slide id, um/px)
IMAGES = (
    ("histoqc/pen__1k_version__pen_green.png", "pen_green", 8.0),
    ("lookalikes/ink01_mskcc_thumbnail_00160_clot_black-ink.jpg", "clot_black_ink", 20.0),
    ("histoqc/coverslip_edge_he__coverslip_edge.png", "coverslip_edge", 8.0),
)


def main() -> None:
    pictures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, sid, mpp in IMAGES:
            rgb = np.asarray(Image.open(DATA / name).convert("RGB"))
            path = Path(tmp) / f"{sid}.tif"
            res = 1e4 / mpp
            tifffile.imwrite(
                path,
                rgb,
                tile=(256, 256),
                photometric="rgb",
                resolution=(res, res),
                resolutionunit="CENTIMETER",
            )
            params = TileParams(tile_um=256.0, tile_px=32, min_blur_variance=0.0)
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

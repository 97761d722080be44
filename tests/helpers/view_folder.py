"""A `wsi predict`-shaped folder around one generated slide, for the viewer's tests.

Made with the project's own writers where the stage has one (tile values, tile file) and plain CSVs
with the columns `wsi predict` writes (manifest.csv, predictions.csv, top_tiles/index.csv). The
heatmap is known: class `a`'s contribution is +1 on the left half of the slide and -1 on the right,
so the page must draw dark red left of the middle and dark blue right of it.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from wsi.formats.tile_file import write_tile_file
from wsi.formats.tile_meta import REQUIRED_ATTRS, TileFileMeta
from wsi.formats.tile_values import write_tile_values

SIDE_UM = 600.0
MPP = 0.5
TILE_UM = 100.0
#: RdBu_r's ends: what +1 and -1 of a symmetric scale look like at full opacity
DARK_RED = (103, 0, 31)
DARK_BLUE = (5, 48, 97)


def _csv(path: Path, header: list[str], rows: list[list[object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)


def tile_grid() -> np.ndarray:
    """(36, 2) top-left corners in um of a 6 x 6 grid of 100 um tiles over the 600 um slide."""
    steps = np.arange(0.0, SIDE_UM, TILE_UM)
    return np.array([(x, y) for y in steps for x in steps])


def build_folder(root: Path, slide_path: Path) -> Path:
    """The prediction folder `root/preds` for the slide at `slide_path` (and a second slide whose file is
    gone); returns it."""
    out = root / "preds"
    xy = tile_grid()
    a = np.where(xy[:, 0] < SIDE_UM / 2, 1.0, -1.0)
    header = ["slide", "path", "status", "tiles", "seconds", "error"]
    gone = str(root / "nowhere" / "gone.svs")
    _csv(
        out / "manifest.csv",
        header,
        [["s1", str(slide_path), "ok", len(xy), 1.0, ""], ["gone", gone, "ok", 4, 1.0, ""]],
    )
    _csv(out / "predictions.csv", ["slide", "prob_a", "prob_b", "predicted"],
         [["s1", "0.800000", "0.200000", "a"], ["gone", "0.100000", "0.900000", "b"]])  # fmt: skip
    write_tile_values(
        out / "heatmaps" / "s1.json", slide="s1", coords_um=xy, tile_um=TILE_UM,
        outputs={"a": a, "b": -a}, mpp=MPP, predicted="a",
    )  # fmt: skip
    top_header = [
        "slide",
        "output",
        "side",
        "rank",
        "tile",
        "x_um",
        "y_um",
        "x0_px",
        "y0_px",
        "contribution",
        "file",
    ]
    _csv(out / "top_tiles" / "index.csv", top_header,
         [["s1", "a", "most", 1, 0, 0.0, 0.0, 0, 0, "1", "s1/a-most-01.png"],
          ["s1", "a", "least", 1, 5, 500.0, 0.0, 1000, 0, "-1", "s1/a-least-01.png"]])  # fmt: skip
    attrs: dict[str, object] = {name: 0 for name in REQUIRED_ATTRS}
    attrs.update(
        slide_id="s1", slide_path=str(slide_path), tile_um=TILE_UM, tile_px=224, mpp=MPP,
        target_mpp=TILE_UM / 224, level0_width=int(SIDE_UM / MPP), level0_height=int(SIDE_UM / MPP),
        backend="openslide", vendor="aperio", params={}, n_kept=len(xy), wsi_version="test",
    )  # fmt: skip
    meta = TileFileMeta.from_attrs(attrs, source="view fixture")
    write_tile_file(out / "work" / "tiles" / "s1.h5", coords=np.round(xy / MPP), coords_um=xy, meta=meta)
    outline = [[[0, 0], [1200, 0], [1200, 1200], [0, 1200], [0, 0]]]
    tissue = {"objectType": "annotation", "classification": {"name": "Tissue", "color": [255, 200, 0]}}
    feature = {
        "type": "Feature",
        "geometry": {"type": "Polygon", "coordinates": outline},
        "properties": tissue,
    }
    qc = {"type": "FeatureCollection", "features": [feature]}
    (out / "qc").mkdir(parents=True, exist_ok=True)
    (out / "qc" / "s1.geojson").write_text(json.dumps(qc), encoding="utf-8")
    return out

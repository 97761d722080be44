"""A slide's work is bounded by what it holds, not by what its header or an option declares (issue 31).

- A 10 MB TIFF declaring 200,000 x 200,000 px with empty tiles and no pyramid fails in seconds, in bounded
  memory, naming the slide, its size, the limit and how to lift it (`--max-read-gpx`); it used to take
  time in proportion to the 40 gigapixels it declares.
- Options that would make an absurd thumbnail or grid (`--thumb-mpp`, `--tile-um` on a large slide) fail
  naming the option and the memory it would need, never numpy's "Unable to allocate 7.28 TiB".
- `wsi make-slides` refuses sizes beyond any scan and prefixes that would leave --out.
- The smaller items: an ROI in micrometres or beyond the slide is said; an empty test split is said;
  `wsi info` exits 1 for a bag that train and predict refuse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from cohorts import make_bag, make_cohort, write_task
from hostile import bounded_memory, write_declared_size_bomb

from wsi.cli.main import cli
from wsi.core.errors import SlideError
from wsi.core.work_bounds import MAX_GRID_TILES, MAX_THUMB_PX, check_grid
from wsi.pipelines.scheduling.jobs import read_manifest
from wsi.pipelines.tile.stage import tile_slides
from wsi.slides.slide import open_slide
from wsi.slides.sources import SlideSource
from wsi.slides.thumbnail import check_thumbnails
from wsi.tiling.params import TileParams

SIDE = 200_000  # the reported file: 200,000 px a side at 0.5 um/px, 10 cm, 40 gigapixels


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / "bomb.tif"
    write_declared_size_bomb(path, SIDE, filled=((3, 3), (4, 3)))
    assert path.stat().st_size < 11e6  # the tile tables, and two tiles
    return path


def _tile(slide: Path, out: Path, *args: str) -> tuple[Any, list[Any]]:
    with bounded_memory():  # 2 GiB beyond what the test process holds: a raw allocation would fail here
        res = CliRunner().invoke(cli, ["tile", str(slide), "--out", str(out), *args])
    rows = read_manifest(out / "tiles" / "manifest.csv") if (out / "tiles" / "manifest.csv").is_file() else []
    return res, rows


def test_a_declared_size_bomb_fails_naming_its_size_and_the_limit(bomb: Path, tmp_path: Path) -> None:
    res, [row] = _tile(bomb, tmp_path / "out")
    assert res.exit_code == 1 and row.status == "failed", res.output
    for needle in ("bomb.tif", "200000 x 200000 px", "the file holds 10.2 MB", "40 gigapixels",
                   "limit of 4", "--max-read-gpx 40", "--pyramid"):  # fmt: skip
        assert needle in row.error, row.error


def test_the_read_limit_is_what_the_option_says(bomb: Path, sample_slide: Any, tmp_path: Path) -> None:
    with open_slide(bomb) as slide:
        check_thumbnails(slide, [8.0], max_read_px=41 * 10**9)  # lifted: 40 gigapixels are allowed
        with pytest.raises(SlideError, match="--max-read-gpx"):
            check_thumbnails(slide, [8.0])
    # a pyramid's small level passes the default; a tiny limit refuses even that, through the option
    [ok] = tile_slides([SlideSource("sample", sample_slide.path, None)], out_dir=tmp_path / "a")
    assert ok.status == "ok", ok.error
    [refused] = tile_slides([SlideSource("sample", sample_slide.path, None)], out_dir=tmp_path / "b",
                            max_read_gpx=1e-6)  # fmt: skip
    assert refused.status == "failed" and "more than the limit of 1e-06" in refused.error


def test_an_absurd_thumbnail_names_the_option_and_its_memory(bomb: Path) -> None:
    with open_slide(bomb) as slide, pytest.raises(SlideError) as err:
        check_thumbnails(slide, [0.5], max_read_px=10**12)
    text = str(err.value)
    assert "--thumb-mpp" in text and "200000 x 200000 px" in text and "GiB of memory" in text
    assert f"{MAX_THUMB_PX} px" in text


def test_an_absurd_grid_names_the_option_and_its_memory(bomb: Path, tmp_path: Path) -> None:
    res, [row] = _tile(bomb, tmp_path / "out", "--tile-um", "1")  # 10^10 cells of 1 um
    assert res.exit_code == 1 and "--tile-um" in row.error and "GB to place them" in row.error, row.error
    assert "Unable to allocate" not in res.output and "MemoryError" not in res.output
    with pytest.raises(SlideError, match=f"{MAX_GRID_TILES:,}"):
        check_grid("s.svs", 200_000, 100_000, mpp=0.25, tile_um=2.0)
    check_grid("s.svs", 200_000, 100_000, mpp=0.25, tile_um=32.0)  # 1.2 million cells: fine


# ---------------------------------------------------------------------------------------- make-slides
@pytest.mark.parametrize("prefix", ["../evil", "/tmp/evil-abs", "a/b", ".hidden", ""])
def test_make_slides_prefix_cannot_leave_out(prefix: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["make-slides", "--out", str(out), "--n", "1", "--size-um", "300",
                                   "--prefix", prefix])  # fmt: skip
    assert res.exit_code == 2 and "--prefix" in res.output, res.output
    assert not list(tmp_path.glob("**/*.svs")) and not Path("/tmp/evil-abs-000.svs").exists()


def test_make_slides_refuses_sizes_beyond_any_scan(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        cli, ["make-slides", "--out", str(tmp_path), "--size-um", "100000", "--mpp", "0.01"]
    )
    assert res.exit_code == 2 and "--size-um 100000 at --mpp 0.01" in res.output and "TB" in res.output
    assert "MemoryError" not in res.output


# --------------------------------------------------------------------------------------------- ROIs
def _roi(path: Path, box: tuple[float, float, float, float]) -> Path:
    x0, y0, x1, y1 = box
    ring = [[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]
    feature = {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [ring]},
               "properties": {"objectType": "annotation"}}  # fmt: skip
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [feature]}))
    return path


def test_an_roi_in_micrometres_is_said(make_slide: Any, tmp_path: Path) -> None:
    """Drawn around the whole slide in micrometres, at 0.25 um/px it covers the top-left sixteenth."""
    slide = make_slide(name="roi-um", size_um=1024.0, mpp=0.25, tissue_boxes_um=[(0, 0, 1024, 1024)],
                       blur_boxes_um=[])  # fmt: skip
    roi = _roi(tmp_path / "um.geojson", (0, 0, 1024, 1024))  # micrometres, not the 4096 px it should be
    params = TileParams(tile_um=128.0, tile_px=64)
    [result] = tile_slides([SlideSource("roi-um", slide.path, None)], out_dir=tmp_path / "out", roi=roi,
                           params=params)  # fmt: skip
    said = f"{result.note} {result.error}"
    assert "may be drawn in micrometres" in said and "um.geojson" in said and "scale it by 4" in said, said


def test_an_roi_beyond_the_slide_is_said(sample_slide: Any, tmp_path: Path) -> None:
    roi = _roi(tmp_path / "far.geojson", (0, 0, 30_000, 30_000))  # another slide's export: 10x this one
    [result] = tile_slides(
        [SlideSource("sample", sample_slide.path, None)], out_dir=tmp_path / "out", roi=roi
    )
    said = f"{result.note} {result.error}"
    assert "does not fit this slide" in said and "3000 x 3000 level-0 px" in said, said


# ---------------------------------------------------------------------------- runs and bags, briefly
def test_an_empty_test_split_is_said(tmp_path: Path) -> None:
    from wsi.pipelines.train import train

    cohort = make_cohort(tmp_path, n_patients=4)  # 2 patients per class: train and val take them all
    result = train(task=write_task(tmp_path / "task.yaml", epochs=1), labels_csv=cohort.labels,
                   features_dir=cohort.bags, out_dir=tmp_path / "run", progress=False)  # fmt: skip
    metrics = json.loads((result.run_dir / "metrics.json").read_text())
    assert metrics["split"] == "val" and "the test split is empty" in metrics["note"]
    assert "split.test 0.26" in metrics["note"] and "optimistic" in metrics["note"]


def test_wsi_info_exits_1_for_a_bag_predict_refuses(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.h5", tmp_path / "bad.h5"
    make_bag(good, label=0, rng=np.random.default_rng(0), n=8)
    make_bag(bad, label=0, rng=np.random.default_rng(1), n=8)
    with h5py.File(bad, "a") as h5:
        h5["feats"][2, 3] = np.nan
    res = CliRunner().invoke(cli, ["info", str(good)])
    assert res.exit_code == 0 and "usable" not in res.output, res.output
    res = CliRunner().invoke(cli, ["info", str(good), str(bad)])
    assert res.exit_code == 1, res.output
    assert "usable" in res.output and "refuse" in res.output and "bad.h5" in res.output
    assert "1 of 2 bag(s) would be refused" in res.output

"""`wsi predict --top-tiles K`: the K tiles pushing each class most and least, read back from the slide
at the tile's resolution, a contact sheet, and a recorded reason for slides that cannot be read."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from cohorts import IN_DIM, make_cohort, write_task
from PIL import Image

from wsi.cli.main import cli
from wsi.formats.bags import BagProvenance, read_bag, write_bag
from wsi.pipelines.inputs.heatmaps import contribution_to_class
from wsi.pipelines.predict.stage import load_run
from wsi.pipelines.predict.top_tiles import pick
from wsi.pipelines.train import train
from wsi.slides.slide import open_slide

PNG = b"\x89PNG\r\n\x1a\n"
TILE_UM, TARGET_MPP = 256.0, 1.0


def _bag_on_slide(path: Path, slide_path: str, mpp: float, rng: np.random.Generator) -> None:
    """A 5 x 5 grid of 256 um tiles over the slide, with features like the cohort's."""
    grid = np.array([(x, y) for y in range(5) for x in range(5)], dtype=np.float32) * TILE_UM  # (25, 2)
    feats = rng.normal(size=(25, IN_DIM)).astype(np.float32)
    feats[:, :4] += np.linspace(-2, 2, 25)[:, None]  # some tiles look like each class
    provenance = BagProvenance(
        slide_id=path.stem, encoder="test-encoder", weights_sha256="0" * 64, tile_um=TILE_UM,
        tile_px=256, mpp=mpp, level0_width=3000, level0_height=3000,
        tile_params={"tile_um": TILE_UM, "tile_px": 256}, target_mpp=TARGET_MPP, slide_path=slide_path,
    )  # fmt: skip
    coords_px = np.round(grid / mpp).astype(np.int64)
    write_bag(path, feats=feats, coords_um=grid, coords_px=coords_px, provenance=provenance)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_top_tiles_are_the_strongest_tiles_read_from_the_slide(sample_slide, tmp_path: Path) -> None:
    cohort = make_cohort(tmp_path / "c", n_patients=8)
    task = write_task(tmp_path / "task.yaml", epochs=1)
    train(
        task=task,
        labels_csv=cohort.labels,
        features_dir=cohort.bags,
        out_dir=tmp_path / "run",
        progress=False,
    )
    bags = tmp_path / "bags"
    bags.mkdir()
    rng = np.random.default_rng(0)
    _bag_on_slide(bags / "on-slide.h5", str(sample_slide.path), sample_slide.mpp, rng)
    _bag_on_slide(bags / "moved.h5", str(tmp_path / "elsewhere" / "slide.svs"), sample_slide.mpp, rng)
    out = tmp_path / "pred"
    res = CliRunner().invoke(
        cli, ["predict", "--model", str(tmp_path / "run"), "--features", str(bags), "--out", str(out),
              "--top-tiles", "3", "--no-heatmaps", "--no-progress"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output  # a slide without pixels does not fail the prediction

    with (out / "top_tiles" / "index.csv").open(newline="") as fh:
        index = list(csv.DictReader(fh))
    assert {r["slide"] for r in index} == {"on-slide"} and len(index) == 2 * 2 * 3  # classes x sides x K
    # the tiles listed are those with the largest / smallest contribution to each class, by the model
    run = load_run(tmp_path / "run", device="cpu")
    bag = read_bag(bags / "on-slide.h5")
    x = torch.from_numpy(bag.feats).float()[None]
    contrib = run.contributions(x, {"coords_um": torch.from_numpy(bag.coords_um)[None]})[0].numpy()
    for c, name in enumerate(("LUAD", "LUSC")):
        expected = pick(contribution_to_class(contrib, c), 3)
        for side in ("most", "least"):
            listed = [int(r["tile"]) for r in index if r["output"] == name and r["side"] == side]
            assert listed == expected[side].tolist(), (name, side)
    # each crop is the slide's own pixels at the tile's resolution
    with open_slide(sample_slide.path) as slide:
        for r in index[:4]:
            crop = np.asarray(Image.open(out / "top_tiles" / r["file"]))
            want = slide.read_region_um(int(r["x0_px"]), int(r["y0_px"]), TILE_UM, TARGET_MPP)
            assert crop.shape == (256, 256, 3) and np.array_equal(crop, want)
    sheet = (out / "top_tiles" / "on-slide" / "contact_sheet.png").read_bytes()
    assert sheet[:8] == PNG
    with Image.open(io.BytesIO(sheet)) as img:
        assert img.width > 3 * 100
    with (out / "top_tiles" / "skipped.csv").open(newline="") as fh:
        skipped = list(csv.DictReader(fh))
    assert [r["slide"] for r in skipped] == ["moved"] and "not reachable" in skipped[0]["reason"]


def test_a_two_class_contact_sheet_shows_each_tile_once() -> None:
    """Two classes' maps are each other's negative: "LUAD most" were "LUSC least" with signs flipped, and
    the sheet showed both pairs twice. Rows are now "towards LUAD" and "towards LUSC", each tile once,
    values in the row's direction; a tile pushing the other way (no tile pushed this way) says so."""
    from wsi.pipelines.predict.top_tiles import contact_sheet, mirrored, sheet_rows

    values = np.array([1.34, 0.547, -0.0912, 0.0326, -0.4])
    maps = {"LUAD": values, "LUSC": -values}
    picks = {name: pick(v, 2) for name, v in maps.items()}
    crops = {
        (name, side): [(np.full((8, 8, 3), 100 + int(i), np.uint8), float(maps[name][i])) for i in idx]
        for name, sides in picks.items() for side, idx in sides.items()
    }  # fmt: skip
    assert mirrored(maps) == {"LUSC": "LUAD"}
    rows = sheet_rows(maps, crops)
    assert list(rows) == ["towards LUAD", "towards LUSC"]
    (luad, s1), (lusc, s2) = rows["towards LUAD"], rows["towards LUSC"]
    assert [v for _, v in luad] == [1.34, 0.547] and [v for _, v in lusc] == [0.4, 0.0912] and s1 == s2 == 1
    shown = [int(c[0, 0, 0]) - 100 for c, _ in luad + lusc]
    assert len(shown) == len(set(shown))  # no tile twice
    three = {"a": values, "b": values * 0.5, "c": -values * 0.2}  # three classes: not mirrored
    assert mirrored(three) == {}
    rows3 = sheet_rows({"risk": values}, {("risk", "most"): luad, ("risk", "least"): [(luad[0][0], 0.2)]})
    assert list(rows3) == ["towards risk", "against risk"] and rows3["against risk"][1] == -1
    assert contact_sheet(rows3, title="s")[:8] == PNG  # a tile of the wrong sign is drawn, marked

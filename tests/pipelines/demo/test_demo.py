"""A small version of `make demo`: generated cohort -> tile -> embed -> train -> predict, end to end."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import h5py
import pytest
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.pipelines.demo.run import DemoOptions, run_demo

TINY_MODEL = (("dim", 32), ("attn_dim", 32), ("depth", 1), ("heads", 2), ("mlp_dim", 32))


@pytest.mark.slow
def test_small_demo_writes_every_output_and_resumes(tmp_path: Path) -> None:
    opts = DemoOptions(
        out_dir=tmp_path / "demo", slides_per_class=4, new_slides=2, slide_um=1024.0,
        encoder="timm:resnet18", epochs=2, model_overrides=dict(TINY_MODEL),
    )  # fmt: skip
    result = run_demo(opts)
    out = result.outputs
    for key in ("labels", "metrics", "predictions"):
        assert out[key].is_file(), key
    assert len(list(out["QC images"].glob("*.png"))) == 8
    bags = sorted(out["feature bags"].glob("*.h5"))
    assert len(bags) == 8
    with h5py.File(bags[0]) as f:
        assert f["feats"].shape[1] == 512 and f.attrs["weights_sha256"] == "random"

    metrics = json.loads(out["metrics"].read_text())
    assert metrics["classes"] == ["LUAD", "LUSC"] and metrics["n"] >= 2
    with open(out["predictions"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["slide"] for r in rows] == ["NEW-00", "NEW-01"]
    for r in rows:
        assert abs(float(r["prob_LUAD"]) + float(r["prob_LUSC"]) - 1.0) < 1e-5
        assert r["predicted"] in ("LUAD", "LUSC")
        assert (out["heatmaps"] / f"{r['slide']}.png").is_file()

    assert "blurred patch planted" in result.planted and "check filter: blurry" in result.planted
    survival = json.loads(out["survival metrics"].read_text())
    assert survival["kind"] == "survival"
    assert out["Kaplan-Meier curves"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["survival report"].is_file()

    # a second run re-uses the finished slides, tiles and bags
    stamps = {p: p.stat().st_mtime_ns for p in bags}
    run_demo(opts)
    assert {p: p.stat().st_mtime_ns for p in bags} == stamps


def test_the_demo_says_what_it_planted(sample_slide, tmp_path: Path) -> None:
    """The sample slides carry a blurred patch on purpose; the demo says so with what the blur filter
    removed (from the tile files), so the manifest's "check filter: blurry" notes read as intended."""
    from wsi.formats.tile_file import read_tile_file
    from wsi.pipelines.demo.run import planted_note
    from wsi.pipelines.tile.stage import tile_slides
    from wsi.slides.sources import find_slides

    results = tile_slides(find_slides([sample_slide.path]), out_dir=tmp_path, progress=False)
    counts = read_tile_file(tmp_path / "tiles" / f"{results[0].slide_id}.h5").meta.counts
    assert counts.n_blurry > 0  # the generated slide's planted patch
    note = planted_note(tmp_path, results)
    share = f"{counts.n_blurry / counts.n_tissue:.1%}"
    assert f"removed {counts.n_blurry} of {counts.n_tissue} tissue tiles ({share}) over 1 slide(s)" in note
    assert "planted" in note and "as intended" in note and str(tmp_path / "qc") in note


def test_demo_help_has_examples() -> None:
    result = CliRunner().invoke(cli, ["demo", "--help"])
    assert result.exit_code == 0 and "Examples:" in result.output and "--weights" in result.output


def test_demo_refuses_an_unwritable_out_before_generating_anything(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(cli, ["demo", "--out", str(blocker / "demo")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert str(blocker / "demo") in result.output and "a-file is a file" in result.output


def test_the_demos_tile_size_has_the_tile_stages_default_and_range() -> None:
    """The demo restates --tile-um and --tile-px: their defaults and bounds are the tile stage's own."""
    from wsi.core.config import bounds_of
    from wsi.pipelines.demo.run import DemoOptions
    from wsi.tiling.params import TileParams

    for name in ("tile_um", "tile_px"):
        assert bounds_of(DemoOptions, name) == bounds_of(TileParams, name)
        assert getattr(DemoOptions(), name) == getattr(TileParams(), name)

"""`wsi info SLIDE` describes the slide (issue 10 item 9): vendor, levels, size, mpp and its source,
objective, backend; a slide without an mpp says so and how to give one."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.slides.slide_info import slide_info


@pytest.mark.parametrize("backend", ["openslide", "tiffslide"])
def test_info_on_a_slide_prints_its_metadata(shared_data: Path, backend: str) -> None:
    path = shared_data / "slides" / "CMU-1-Small-Region.svs"
    res = CliRunner().invoke(cli, ["info", str(path), "--backend", backend])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "slide (aperio)" in out and f"backend          {backend}" in out
    assert "size_px          2220 x 2967" in out and "levels           1" in out
    assert "level 0          2220 x 2967 px, downsample 1, 0.499 um/px, 240 px tiles" in out
    assert f"mpp_source       metadata ({backend}.mpp-x)" in out and "objective_power  20" in out
    assert "HDF5" not in out and "\nmpp              0.499\n" in out


def test_a_slide_without_mpp_is_described_and_says_how_to_give_one(shared_data: Path) -> None:
    path = shared_data / "slides" / "tcga-cr-7395-01a-01-ts1.svs"
    info = slide_info(path)
    assert info["levels"] == 2 and info["size_px"] == "4443 x 3567"
    assert "unknown" in info["mpp"] and "--mpp" in info["mpp"] and "mpp_source" not in info
    given = slide_info(path, mpp=0.25)
    assert given["mpp"] == 0.25 and given["mpp_source"] == "given" and given["size_mm"] == "1.11 x 0.89"


def test_info_on_a_file_that_is_no_slide_nor_bag(tmp_path: Path) -> None:
    junk = tmp_path / "notes.svs"
    junk.write_text("hello")
    res = CliRunner().invoke(cli, ["info", str(junk)])
    assert res.exit_code == 2 and "notes.svs" in res.output and "Traceback" not in res.output

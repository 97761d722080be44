"""DICOM WSI series (issue 20, item 5): a folder holding one series is one slide; a single .dcm still
works; a folder of series folders works. Fixture: tests/fixtures/dicom_wsi (real H&E pixels, CC0)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.formats.tile_file import read_tile_file
from wsi.slides.dicom_series import find_series
from wsi.slides.slide import open_slide
from wsi.slides.sources import find_slides

FIXTURE = Path(__file__).parents[2] / "fixtures" / "dicom_wsi" / "cmu1-crop"


@pytest.fixture()
def cohort(tmp_path: Path) -> Path:
    """dicom/caseA and dicom/caseB (the same series twice: two series folders), plus a non-WSI .dcm."""
    root = tmp_path / "dicom"
    for name in ("caseA", "caseB"):
        shutil.copytree(FIXTURE, root / name)
    (root / "caseB" / "notes.dcm").write_bytes(b"not dicom at all")
    return root


def test_the_fixture_is_a_three_level_series_of_real_pixels() -> None:
    with open_slide(FIXTURE / "level1.dcm") as slide:  # any instance opens the whole series
        assert slide.dimensions == (1024, 1024) and slide.mpp == pytest.approx(0.499)
        assert len(slide.level_dimensions) == 3 and slide.vendor == "dicom"
        tile = slide.read_region_um(0, 0, 256, 1.0)
    assert tile.shape == (256, 256, 3) and tile.std() > 20  # tissue, not a blank frame
    assert np.median(tile[..., 0]) > np.median(tile[..., 1])  # H&E: more red than green


def test_a_folder_holding_one_series_is_one_slide_named_after_it() -> None:
    [src] = find_slides([FIXTURE])
    assert src.slide_id == "cmu1-crop" and src.path.name == "level0.dcm"  # the level-0 instance
    [series] = find_series(sorted(FIXTURE.glob("*.dcm")))
    assert series.n_files == 3 and series.series_uid.startswith("1.2.")


def test_a_folder_of_series_folders_and_a_single_file(cohort: Path) -> None:
    found = find_slides([cohort])
    assert [s.slide_id for s in found] == ["caseA", "caseB"]  # the non-DICOM notes.dcm left out
    [single] = find_slides([cohort / "caseA" / "level2.dcm"])
    assert single.path.name == "level2.dcm"
    with open_slide(single.path) as slide:
        assert slide.dimensions == (1024, 1024)  # still the whole series


def test_two_series_in_one_folder_are_two_slides(tmp_path: Path) -> None:
    pydicom = pytest.importorskip("pydicom")
    folder = tmp_path / "mixed"
    folder.mkdir()
    for path in sorted(FIXTURE.glob("*.dcm")):
        shutil.copy(path, folder / path.name)
        ds = pydicom.dcmread(path)
        uid = str(ds.SeriesInstanceUID)
        ds.SeriesInstanceUID = uid[: uid.rindex(".")] + ".9"  # another series, same study
        ds.save_as(folder / f"other-{path.name}")
    ids = [s.slide_id for s in find_slides([folder])]
    assert len(ids) == 2 and all(i.startswith("mixed-") for i in ids) and ids[0] != ids[1]


def test_wsi_tile_on_a_folder_of_series(cohort: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["tile", str(cohort), "--out", str(out), "--tile-um", "128"])
    assert result.exit_code == 0, result.output
    for case in ("caseA", "caseB"):
        tf = read_tile_file(out / "tiles" / f"{case}.h5")
        assert len(tf) > 0 and tf.meta.vendor == "dicom"


def test_series_found_without_pydicom_through_openslide(cohort: Path, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pydicom", None)  # `import pydicom` now raises ImportError
    found = find_slides([cohort])
    assert [s.slide_id for s in found] == ["caseA", "caseB"]
    with open_slide(found[0].path) as slide:
        assert slide.dimensions == (1024, 1024)


def test_wsi_info_on_a_series_folder_describes_its_slide() -> None:
    """As `wsi tile` reads it: the folder is the slide (its level-0 instance), not a folder of files."""
    result = CliRunner().invoke(cli, ["info", str(FIXTURE)])
    assert result.exit_code == 0, result.output
    assert "level0.dcm" in result.output and "1024" in result.output and "dicom" in result.output

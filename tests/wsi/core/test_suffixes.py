"""The one suffix table (wsi/core/suffixes.py): folder search, labels and help all follow it."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.core.suffixes import FOLDER_SLIDE_SUFFIXES, NAME_SUFFIXES, SLIDE_SUFFIXES, name_suffix, strip_suffix
from wsi.slides.sources import find_slides


def test_folder_search_finds_every_slide_format_but_dicom(tmp_path: Path) -> None:
    for suffix in SLIDE_SUFFIXES:
        (tmp_path / f"s{suffix.replace('.', '_')}{suffix.upper()}").write_bytes(b"x")  # any case
    (tmp_path / "notes.txt").write_text("not a slide")
    found = {p.path.suffix.lower() for p in find_slides([tmp_path])}
    assert found == set(FOLDER_SLIDE_SUFFIXES)
    # the three lists that used to disagree: Sakura and Zeiss are slides; a .dcm counts only as part of a
    # whole-slide series (wsi.slides.dicom_series), which these empty files are not
    assert {".svslide", ".czi"} <= found and ".dcm" not in found


def test_label_names_lose_any_known_suffix() -> None:
    assert strip_suffix("TCGA-01.SVS") == "TCGA-01"
    assert strip_suffix("a.svslide") == "a" and strip_suffix("b.czi") == "b"
    assert strip_suffix("scan.ome.tiff") == "scan" and strip_suffix("vol.nii.gz") == "vol"
    assert strip_suffix("bag.h5") == "bag" and strip_suffix("plain") == "plain"
    assert list(NAME_SUFFIXES) == sorted(NAME_SUFFIXES, key=len, reverse=True)
    assert name_suffix("X.NII.GZ") == ".nii.gz" and name_suffix("a.b.svs") == ".svs"


def test_tile_help_lists_every_searched_suffix() -> None:
    result = CliRunner().invoke(cli, ["tile", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    missing = [s for s in FOLDER_SLIDE_SUFFIXES if f"{s} " not in text and f"{s})" not in text]
    assert not missing, f"`wsi tile --help` does not name {missing}"

"""Slide lists: an unusable slide id fails that slide, never the batch (issue 10 item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from wsi.core.errors import WsiError
from wsi.slides.sources import find_slides


def test_unusable_ids_become_records_with_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "slides"
    (folder / "a").mkdir(parents=True)
    (folder / "b").mkdir()
    for name in ("good.svs", "a/!!!.svs", "b/!!!.svs", "标本.svs"):  # two unusable names: no clash error
        (folder / name).write_bytes(b"x")
    listing = tmp_path / "list.csv"
    listing.write_text("path,slide_id\nslides/good.svs,ok-id\nslides/标本.svs,---\n")
    found = find_slides([folder, listing])
    sources = {(s.path.name, s.slide_id): s for s in found}
    assert sources[("good.svs", "good")].error == "" and sources[("标本.svs", "标本")].error == ""
    assert sources[("good.svs", "ok-id")].error == ""
    bad = [s for s in found if s.error]
    assert sorted((s.path.parent.name, s.slide_id) for s in bad) == [
        ("a", "!!!"),
        ("b", "!!!"),
        ("slides", "---"),
    ]
    for src in bad:  # each names its file (and the CSV line) and how to fix it
        assert str(src.path) in src.error and "slide_id" in src.error
    assert "list.csv line 3" in next(s for s in bad if s.slide_id == "---").error


def test_two_files_with_one_usable_id_are_still_a_usage_error(tmp_path: Path) -> None:
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "x.svs").write_bytes(sub.encode())
    with pytest.raises(WsiError, match="share one slide id"):
        find_slides([tmp_path / "a", tmp_path / "b"])

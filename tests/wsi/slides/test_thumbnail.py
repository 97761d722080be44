"""Thumbnails read together share their level read (the tile stage's tissue thumbnail and QC picture),
and the file-tile probe finds a bad JPEG tile once however many reads touch it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from wsi.slides.slide import Slide, open_slide
from wsi.slides.thumbnail import read_thumbnail, read_thumbnails
from wsi.slides.tiff_tiles import FileTileProbe, file_tiles_under


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int, int, int]]:
    calls: list[tuple[int, int, int, int, int]] = []
    real = Slide.read_level

    def counting(self: Slide, level: int, x: int, y: int, w: int, h: int) -> np.ndarray:
        calls.append((level, x, y, w, h))
        return real(self, level, x, y, w, h)

    monkeypatch.setattr(Slide, "read_level", counting)
    return calls


@pytest.mark.parametrize("backend", ["openslide", "tiffslide"])
def test_thumbnails_of_one_level_are_one_read_and_equal_separate_reads(
    shared_data: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_slide(shared_data / "slides" / "CMU-1-Small-Region.svs", backend=backend) as slide:
        alone = [read_thumbnail(slide, mpp) for mpp in (8.0, 1.2)]
        calls = _count_reads(monkeypatch)
        together = read_thumbnails(slide, (8.0, 1.2))
    assert len(calls) == 1  # one level (the slide has one), read once for both sizes
    for a, b in zip(alone, together, strict=True):
        assert np.array_equal(a.image, b.image) and a.mpp == b.mpp and not b.unknown.any()
    assert together[1].image.shape[1] > 6 * together[0].image.shape[1]


def test_the_probe_reads_each_file_tile_once_and_counts_tiles_under_boxes(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "copy.svs"
    shutil.copy(shared_data / "slides" / "CMU-1-Small-Region.svs", path)
    with open_slide(path) as slide:
        probe = FileTileProbe(slide, 0)
        calls = _count_reads(monkeypatch)
        # a window over 2 x 2 file tiles (240 px), probed twice: nothing bad -> the window is named
        first = probe.locate((200, 200, 100, 100), "a read failed")
        second = probe.locate((200, 200, 100, 100), "a read failed")
        assert len(calls) == 4  # each file tile decoded once
        assert [r.as_list() for r in first] == [[200, 200, 100, 100, 0]] == [r.as_list() for r in second]
        # boxes (level-0 x0, y0, x1, y1): one inside a tile, one across four, one outside the slide
        boxes = np.array([[10, 10, 20, 20], [230, 230, 250, 250], [5000, 5000, 5100, 5100]])
        assert file_tiles_under(slide, 0, boxes) == 4  # (0,0) counted once

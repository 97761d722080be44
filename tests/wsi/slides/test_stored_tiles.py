"""Decoding a level's JPEG tiles directly (wsi.slides.stored_tiles) gives openslide's own pixels (issue 35).

openslide paints the tiles it decodes; the direct path copies them. Both must return the same bytes, for
Aperio's RGB JPEG (CMU-1-Small-Region, 240 px tiles, one level) and YCbCr JPEG (the generated slides,
a pyramid of 256 px tiles), whole levels, windows across tile borders and past the slide's edge.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from damaged_slides import damage_tiles

from wsi.core.errors import SlideError
from wsi.slides.slide import open_slide
from wsi.slides.stored_tiles import CACHE_BYTES, jpeg_levels
from wsi.synthetic import SampleSlide


@pytest.fixture(scope="module")
def generated(make_slide: Callable[..., SampleSlide]) -> Path:
    return make_slide(name="stored", size_um=2200.0, mpp=0.5, seed=5).path


def _slides(shared_data: Path, generated: Path) -> list[Path]:
    return [shared_data / "slides" / "CMU-1-Small-Region.svs", generated]


def test_direct_reads_are_openslides_pixels(shared_data: Path, generated: Path) -> None:
    rng = np.random.default_rng(0)
    for path in _slides(shared_data, generated):
        with open_slide(path) as fast, open_slide(path, direct_jpeg=False) as slow:
            assert fast._direct and not slow._direct  # the direct path is taken where it can be
            for level, (lw, lh) in enumerate(fast.level_dimensions):
                windows = [(0, 0, lw, lh)] + [  # the whole level, then windows across stored tiles
                    (int(rng.integers(-100, lw)), int(rng.integers(-100, lh)), *rng.integers(1, 700, 2))
                    for _ in range(5)  # some partly outside the level
                ]
                for x, y, w, h in windows:
                    a = fast.read_level(level, x, y, int(w), int(h))
                    assert np.array_equal(a, slow.read_level(level, x, y, int(w), int(h)))
            for x, y in rng.integers(0, min(fast.dimensions), (6, 2)):  # tiles as the stages read them
                for size_um, mpp in ((256.0, 1.0), (112.0, 0.5), (512.0, 2.0)):
                    a = fast.read_region_um(int(x), int(y), size_um, mpp)
                    assert np.array_equal(a, slow.read_region_um(int(x), int(y), size_um, mpp))


def test_levels_found_and_the_cache_stays_bounded(shared_data: Path) -> None:
    levels = jpeg_levels(shared_data / "slides" / "CMU-1-Small-Region.svs")
    [tiles] = levels.values()
    assert (tiles.width, tiles.height, tiles.tile_w, tiles.tile_h) == (2220, 2967, 240, 240)
    tiles.read(0, 0, tiles.width, tiles.height)  # 130 tiles of 169 kB: more than the cache holds
    assert sum(t.nbytes for t in tiles._cache.values()) <= CACHE_BYTES
    tiles.close()
    # JPEG 2000 tiles are left to the backend
    assert jpeg_levels(shared_data / "slides" / "tcga-cr-7395-01a-01-ts1.svs") == {}


def test_a_corrupt_tile_is_a_slide_error_naming_the_place(shared_data: Path, tmp_path: Path) -> None:
    cmu = shared_data / "slides" / "CMU-1-Small-Region.svs"
    path = damage_tiles(cmu, tmp_path / "bad.svs", [(2, 3)])  # tile (col 2, row 3)
    with open_slide(path) as slide:
        slide.read_level(0, 0, 0, 240, 240)  # another tile still reads
        with pytest.raises(SlideError, match="cannot read level 0 at x=480 y=720"):
            slide.read_level(0, 480, 720, 240, 240)


def test_a_slide_stays_readable_when_its_file_goes_after_opening(generated: Path, tmp_path: Path) -> None:
    """The direct path opens the file with the slide, as openslide's handle does: a remote slide's local
    copy that the cache evicts while a reader holds it open (wsi.storage.cache) is still read, and read
    right."""
    copy = tmp_path / "copy.svs"
    shutil.copyfile(generated, copy)
    with open_slide(generated, direct_jpeg=False) as here, open_slide(copy) as slide:
        copy.unlink()
        for level, (lw, lh) in enumerate(slide.level_dimensions):
            assert np.array_equal(slide.read_level(level, 0, 0, lw, lh), here.read_level(level, 0, 0, lw, lh))

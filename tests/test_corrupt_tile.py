"""A corrupt JPEG tile costs its own tiles, not the slide (issue 10 item 4).

CMU-1-Small-Region.svs is one level of 240 px JPEG tiles, so the tissue thumbnail is read from level 0
and used to fail on one bad tile, at "x=0 y=0". Here 400 bytes of one tile inside the tissue are
overwritten (found through the TIFF's TileOffsets), under both backends.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from pipelines.tile import tile_slides
from wsi.slide import open_slide
from wsi.sources import find_slides
from wsi.tilefile import read_tile_file
from wsi.tiling import TileParams

BACKENDS = ("openslide", "tiffslide")
JPEG_TILE_PX = 240
COL, ROW = 4, 6  # a tile in the middle of the tissue: level-0 x=960, y=1440


@pytest.fixture(scope="module")
def damaged(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import tifffile

    path = tmp_path_factory.mktemp("corrupt") / "CMU-1-Small-Region.svs"
    shutil.copy(shared_data / "slides" / "CMU-1-Small-Region.svs", path)
    path.chmod(0o644)
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        assert (page.tilewidth, page.tilelength) == (JPEG_TILE_PX, JPEG_TILE_PX)
        per_row = -(-page.imagewidth // JPEG_TILE_PX)
        offset = page.tags["TileOffsets"].value[ROW * per_row + COL]
    with open(path, "r+b") as fh:  # the tile's first 400 bytes: not a JPEG any more, for every decoder
        fh.seek(offset)
        fh.write(bytes(400))
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_thumbnail_marks_the_bad_tile_unknown_at_its_real_place(
    damaged: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    with open_slide(damaged, backend=backend) as slide, caplog.at_level(logging.WARNING):
        thumb = slide.thumbnail(8.0)
    [region] = thumb.unreadable
    assert (region.x_px, region.y_px) == (COL * JPEG_TILE_PX, ROW * JPEG_TILE_PX)
    assert (region.w_px, region.h_px, region.level) == (JPEG_TILE_PX, JPEG_TILE_PX, 0)
    assert f"x={COL * JPEG_TILE_PX} y={ROW * JPEG_TILE_PX}" in caplog.text and "x=0 y=0" not in caplog.text
    # the unknown part of the thumbnail is that tile's footprint (about 15 px at 8 um/px), nothing else
    ys, xs = thumb.unknown.nonzero()
    scale = slide.mpp / thumb.mpp
    assert abs(xs.min() - COL * JPEG_TILE_PX * scale) <= 1 and abs(ys.min() - ROW * JPEG_TILE_PX * scale) <= 1
    assert thumb.unknown.sum() <= (JPEG_TILE_PX * scale + 2) ** 2
    assert thumb.image[~thumb.unknown].mean() < 250  # the rest was read (tissue, not white)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_slide_is_tiled_and_the_bad_tiles_counted(damaged: Path, backend: str, tmp_path: Path) -> None:
    # the tiles overlapping the bad JPEG tile fail; the tolerance is raised because on this small
    # slide they are 4 of its 10 tissue tiles (the default 5% would fail it, as a damaged file)
    params = TileParams(max_unreadable_fraction=0.5)
    [result] = tile_slides(find_slides([damaged]), out_dir=tmp_path, params=params, backend=backend)
    assert result.status == "ok", result.error
    meta = read_tile_file(tmp_path / "tiles" / f"{damaged.stem}.h5").meta
    step = round(params.tile_um / 0.499)  # level-0 px per tile
    x0, y0 = COL * JPEG_TILE_PX, ROW * JPEG_TILE_PX
    hit_x = [x for x in range(0, 2220 - step + 1, step) if x < x0 + JPEG_TILE_PX and x + step > x0]
    hit_y = [y for y in range(0, 2967 - step + 1, step) if y < y0 + JPEG_TILE_PX and y + step > y0]
    assert meta["n_unreadable"] == len(hit_x) * len(hit_y) == 4
    assert meta["n_kept"] == result.n == meta["n_tissue"] - 4 - meta["n_background"] - meta["n_blurry"] > 0

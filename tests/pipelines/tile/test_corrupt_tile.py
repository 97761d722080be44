"""A corrupt JPEG tile costs its own tiles, not the slide (issue 10 item 4).

CMU-1-Small-Region.svs is one level of 240 px JPEG tiles, so the tissue thumbnail is read from level 0
and used to fail on one bad tile, at "x=0 y=0". Here 400 bytes of one tile inside the tissue are
overwritten (found through the TIFF's TileOffsets), under both backends and at default settings; and a
copy with many bad tiles still fails as a damaged file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from damaged_slides import damage_tiles
from PIL import Image

from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.scheduling.jobs import read_manifest
from wsi.pipelines.tile.stage import output_paths, tile_slides
from wsi.slides.slide import open_slide
from wsi.slides.sources import find_slides
from wsi.slides.thumbnail import Thumbnail, read_thumbnail
from wsi.slides.tiff_tiles import FileDamage
from wsi.tiling.grid import find_tissue
from wsi.tiling.params import TileParams
from wsi.tiling.qc import UNKNOWN_RGB, qc_size

BACKENDS = ("openslide", "tiffslide")
JPEG_TILE_PX = 240
COL, ROW = 4, 6  # a tile in the middle of the tissue: level-0 x=960, y=1440
#: eight JPEG tiles inside the tissue of CMU-1-Small-Region (about 14% of the 59 under its tissue tiles)
MANY = ((3, 2), (4, 4), (3, 6), (4, 6), (3, 8), (4, 8), (4, 10), (5, 10))


def _damage(source: Path, path: Path, cells: Sequence[tuple[int, int]]) -> Path:
    """A copy of `source` with the first 400 bytes of each (col, row) JPEG tile zeroed."""
    import tifffile

    with tifffile.TiffFile(source) as tif:
        page = tif.pages[0]
        assert (page.tilewidth, page.tilelength) == (JPEG_TILE_PX, JPEG_TILE_PX)
    return damage_tiles(source, path, cells)


@pytest.fixture(scope="module")
def damaged(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = shared_data / "slides" / "CMU-1-Small-Region.svs"
    return _damage(source, tmp_path_factory.mktemp("corrupt") / "CMU-1-Small-Region.svs", [(COL, ROW)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_thumbnail_marks_the_bad_tile_unknown_at_its_real_place(
    damaged: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    with open_slide(damaged, backend=backend) as slide, caplog.at_level(logging.WARNING):
        thumb = read_thumbnail(slide, 8.0)
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
def test_the_slide_is_tiled_and_the_bad_tiles_counted(
    damaged: Path, backend: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # default settings: the tiles overlapping the bad JPEG tile fail (4 of the slide's 10 tissue tiles),
    # but the file is not "damaged": 1 of the 59 JPEG tiles under its tissue tiles cannot be decoded
    params = TileParams()
    with caplog.at_level(logging.WARNING):
        [result] = tile_slides(find_slides([damaged]), out_dir=tmp_path, backend=backend)
    assert result.status == "ok", result.error
    meta = read_tile_file(tmp_path / "tiles" / f"{damaged.stem}.h5").meta
    step = round(params.tile_um / 0.499)  # level-0 px per tile
    x0, y0 = COL * JPEG_TILE_PX, ROW * JPEG_TILE_PX
    hit_x = [x for x in range(0, 2220 - step + 1, step) if x < x0 + JPEG_TILE_PX and x + step > x0]
    hit_y = [y for y in range(0, 2967 - step + 1, step) if y < y0 + JPEG_TILE_PX and y + step > y0]
    c = meta.counts
    assert c.n_unreadable == len(hit_x) * len(hit_y) == 4
    assert c.n_kept == result.n == c.n_tissue - 4 - c.n_background - c.n_blurry > 0
    # the real place, in the tile file, the manifest row and the log; "x=0 y=0" nowhere
    assert meta.damage.regions == ((x0, y0, JPEG_TILE_PX, JPEG_TILE_PX, 0),)
    assert meta.damage.n_thumbnail_unreadable == 1
    assert (meta.damage.n_file_tiles_unreadable, meta.damage.n_file_tiles_tissue) == (1, 59)
    [row] = read_manifest(tmp_path / "tiles" / "manifest.csv")
    assert row.status == "ok" and f"x={x0} y={y0}" in row.error and "4 of 10 tissue tiles" in row.error
    assert "x=0 y=0" not in caplog.text
    # the thumbnail is read once for the tissue mask and the QC picture: its warning comes once
    assert caplog.text.count("marked unknown on the tissue thumbnail") == 1
    assert sum(f"x={x0} y={y0}" in r.getMessage() for r in caplog.records) == 2  # thumbnail + tile summary


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_qc_picture_hatches_the_bad_tile_and_counts_it_in_the_legend(
    damaged: Path, shared_data: Path, backend: str, tmp_path: Path
) -> None:
    clean = shared_data / "slides" / "CMU-1-Small-Region.svs"
    for path, out in ((damaged, tmp_path / "bad"), (clean, tmp_path / "clean")):
        [r] = tile_slides(find_slides([path]), out_dir=out, backend=backend)
        assert r.status == "ok", r.error
    w, h = qc_size((2220, 2967))
    bad = np.asarray(Image.open(output_paths(tmp_path / "bad", damaged.stem).qc).convert("RGB"))
    good = np.asarray(Image.open(output_paths(tmp_path / "clean", clean.stem).qc).convert("RGB"))
    assert bad.shape[1] == good.shape[1] == w and bad.shape[0] > h  # the legible map, legend below

    def swatches(qc: np.ndarray) -> int:
        return int((qc[h:] == np.asarray(UNKNOWN_RGB, np.uint8)).all(axis=-1).sum())

    assert swatches(bad) >= 100 and swatches(good) == 0  # the legend item only where something is lost
    assert bad[h:].shape[0] > good[h:].shape[0]  # ... and the line naming the place
    # the hatching sits on the bad tile's footprint, inside the dark borders of its unreadable tiles
    s = w / 2220
    box = bad[round(ROW * JPEG_TILE_PX * s) : round((ROW + 1) * JPEG_TILE_PX * s),
              round(COL * JPEG_TILE_PX * s) : round((COL + 1) * JPEG_TILE_PX * s)].astype(int)  # fmt: skip
    grey = np.abs(box - np.asarray(UNKNOWN_RGB)).sum(axis=-1) < 80  # hatch pixels
    assert 0.3 < grey.mean() < 0.7


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_with_many_bad_tiles_fails_as_damaged(shared_data: Path, backend: str, tmp_path: Path) -> None:
    path = _damage(shared_data / "slides" / "CMU-1-Small-Region.svs", tmp_path / "many.svs", MANY)
    [result] = tile_slides(find_slides([path]), out_dir=tmp_path / "out", backend=backend, save_tiles=True)
    assert result.status == "failed"
    assert "the file is damaged" in result.error and "could not be decoded" in result.error
    assert f"{len(MANY)} of the " in result.error and "max_unreadable_fraction=0.05" in result.error
    x, y = sorted(MANY, key=lambda c: (c[1], c[0]))[0]
    assert f"x={x * JPEG_TILE_PX} y={y * JPEG_TILE_PX}" in result.error  # the first, where it is
    paths = output_paths(tmp_path / "out", "many")
    assert not paths.h5.exists() and not paths.zarr.exists()  # nothing a re-run or embed could trust


def test_the_damage_rule_counts_the_files_own_tiles() -> None:
    """More than max_unreadable_fraction of the stored tiles under the tissue, and never one lone tile
    unless the fraction is 0."""

    def damaged(n_bad: int, n_tissue: int, limit: float = 0.05) -> bool:
        return FileDamage(n_bad, n_tissue, level=0, tile_px=(240, 240)).too_much(limit)

    assert not damaged(1, 59) and not damaged(2, 59) and damaged(3, 59)  # 5% of 59 is 2.95
    assert not damaged(1, 4)  # one isolated bad tile on a tiny slide: not a damaged file
    assert damaged(2, 4) and damaged(8, 59)
    assert damaged(1, 1000, limit=0.0)  # 0: every bad tile fails the slide
    assert not damaged(50, 100, limit=0.5) and damaged(51, 100, limit=0.5)


def test_unknown_cells_are_tried_not_called_background(shared_data: Path) -> None:
    """A thumbnail hole at the tissue edge (the slide could not be decoded there) keeps its cell a
    candidate; the same pixels merely white (glass) do not."""
    with open_slide(shared_data / "slides" / "CMU-1-Small-Region.svs") as slide:
        params = TileParams()
        clean = read_thumbnail(slide, params.tissue.thumb_mpp)
        found = find_tissue(slide, params, thumbnail=clean)
        scale = slide.mpp / clean.mpp  # thumbnail px per level-0 px
        # a candidate cell with a neighbour outside the tissue: wiping it leaves no enclosed hole
        edge = [
            i for i in found.candidates
            if any(j not in found.candidates for j in (i - 1, i + 1))
        ]  # fmt: skip
        assert edge
        x, y = found.grid.coords[edge[0]]
        step = found.grid.step_px
        ys = slice(int(y * scale), int(np.ceil((y + step) * scale)))
        xs = slice(int(x * scale), int(np.ceil((x + step) * scale)))
        image = clean.image.copy()
        image[ys, xs] = 255
        unknown = np.zeros(image.shape[:2], bool)
        unknown[ys, xs] = True
        as_glass = find_tissue(slide, params, thumbnail=Thumbnail(image, np.zeros_like(unknown), clean.mpp))
        as_unknown = find_tissue(slide, params, thumbnail=Thumbnail(image, unknown, clean.mpp))
    assert edge[0] not in as_glass.candidates  # white: glass, not tried
    assert edge[0] in as_unknown.candidates  # unknown: maybe tissue, tried
    assert as_unknown.unknown is not None and as_unknown.unknown[ys, xs].all()

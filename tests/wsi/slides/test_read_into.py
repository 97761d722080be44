"""Tiles read into a given array (`Slide.read_region_um(..., out=)`) are the tiles read without one.

The tile stage reads each tile into its row of the chunk array, and a window that is exactly one stored
JPEG tile is decoded straight into it with imagecodecs rather than through tifffile's decode (issue 35).
Both must give the same bytes as before and as openslide, for Aperio's RGB-coded JPEG
(CMU-1-Small-Region, 240 px tiles) and YCbCr JPEG (a generated pyramid of 256 px tiles): aligned
windows, windows across tile borders, at and past the level's edge, left-out (sparse) tiles, and the
reduced and resampled kinds; a wrong destination and a damaged tile are clear errors.
"""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from damaged_slides import damage_tiles

from wsi.core.errors import SlideError
from wsi.pipelines.tile.read import _read_chunk
from wsi.slides.slide import Slide, open_slide
from wsi.slides.stored_tiles import jpeg_colorspace, jpeg_levels
from wsi.synthetic import SampleSlide
from wsi.tiling.params import TileParams


@pytest.fixture(scope="module")
def generated(make_slide: Callable[..., SampleSlide]) -> Path:
    return make_slide(name="read-into", size_um=1200.0, mpp=0.5, seed=3).path


def _cmu(shared_data: Path) -> Path:
    return shared_data / "slides" / "CMU-1-Small-Region.svs"


def _windows(width: int, height: int, tile: int) -> list[tuple[int, int]]:
    """Top-lefts of windows of `tile` px in a level of `width` x `height` px: on the stored grid of `tile`
    px, off it, at and past the level's edge."""
    last_x, last_y = (width // tile - 1) * tile, (height // tile - 1) * tile  # the last whole stored tile
    return [
        (0, 0), (tile, tile), (last_x, last_y),  # exactly one stored tile each
        (37, 5), (tile - 1, tile + 100),  # across stored tiles
        (width - tile // 2, 0), (0, height - 10), (width - 3, height - 3),  # running past the level's edge
        (-tile, 0), (-50, -70), (width + 5, 0),  # before it, and wholly outside
    ]  # fmt: skip


def _compare(slide: Slide, reference: Slide, size_um: float, mpp: float, xys: list[tuple[int, int]]) -> None:
    """Each tile read into a row of a chunk equals the tile read without `out`, and openslide's."""
    p = round(size_um / mpp)
    chunk = np.full((len(xys), p, p, 3), 7, np.uint8)  # not white, not black: every byte must be written
    for j, (x, y) in enumerate(xys):
        row = chunk[j]
        assert slide.read_region_um(x, y, size_um, mpp, out=row) is row
        old = slide.read_region_um(x, y, size_um, mpp)
        assert np.array_equal(row, old), (x, y, size_um, mpp)
        assert np.array_equal(row, reference.read_region_um(x, y, size_um, mpp)), (x, y, size_um, mpp)


def test_cmu_tiles_read_into_out_are_the_tiles_read_without(shared_data: Path) -> None:
    with open_slide(_cmu(shared_data)) as slide, open_slide(_cmu(shared_data), direct_jpeg=False) as ref:
        assert slide._direct[0].colorspace == "RGB"  # Aperio's RGB-coded JPEG, not YCbCr
        side = 240 * slide.mpp  # one stored tile at level 0
        xys = _windows(*slide.dimensions, 240)
        _compare(slide, ref, side, slide.mpp, xys[:3])
        assert not slide._direct[0]._cache  # whole stored tiles are not cached
        _compare(slide, ref, side, slide.mpp, xys[3:])
        for size_um, mpp in ((256.0, 1.0), (112.0, 0.5), (100.0, 0.3)):  # reduce, resample at other sizes
            _compare(slide, ref, size_um, mpp, xys)


def test_generated_tiles_read_into_out_are_the_tiles_read_without(generated: Path) -> None:
    with open_slide(generated) as slide, open_slide(generated, direct_jpeg=False) as ref:
        assert slide._direct[0].colorspace is None  # YCbCr, as libjpeg finds it
        for level, ds in enumerate(slide.level_downsamples[:3]):  # 256 px tiles at levels 0, 1, 2
            mpp = slide.mpp * ds
            xys = [(round(x * ds), round(y * ds)) for x, y in _windows(*slide.level_dimensions[level], 256)]
            _compare(slide, ref, 256 * mpp, mpp, xys[:3])
            assert not slide._direct[level]._cache  # whole stored tiles are not cached
            _compare(slide, ref, 256 * mpp, mpp, xys[3:])
        _compare(slide, ref, 100.0, 0.5, _windows(*slide.dimensions, 200))  # a grid off the stored one


def test_a_whole_stored_tile_is_the_decoded_level(generated: Path) -> None:
    """Against tifffile's own decode of the whole level: the same pixels, also into a view of a larger
    window (a part inside the level is not C-contiguous) and from the cache of an earlier read."""
    import tifffile

    page_pixels = tifffile.imread(generated, key=0)
    with open_slide(generated) as slide:
        tiles = slide._direct[0]
        for x, y in ((0, 0), (512, 256), (1024, 2048)):
            assert np.array_equal(tiles.read(x, y, 256, 256), page_pixels[y : y + 256, x : x + 256])
        assert not tiles._cache
        window = np.full((256, 512, 3), 7, np.uint8)
        tiles.read(256, 0, 256, 256, out=window[:, 100:356])  # a view: decoded aside, then copied
        assert np.array_equal(window[:, 100:356], page_pixels[:256, 256:512])
        assert (window[:, :100] == 7).all() and (window[:, 356:] == 7).all()
        assert np.array_equal(slide.read_level(0, -256, 0, 512, 256)[:, 256:], page_pixels[:256, :256])
        tiles.read(250, 250, 20, 20)  # an unaligned window caches the four tiles under it
        assert len(tiles._cache) == 4
        out = np.zeros((256, 256, 3), np.uint8)
        assert np.array_equal(tiles.read(256, 256, 256, 256, out=out), page_pixels[256:512, 256:512])


def test_a_left_out_tile_is_white_in_out(generated: Path) -> None:
    [tiles] = [t for t in jpeg_levels(generated).values() if t.width == 2400]
    counts = tiles.counts.copy()
    counts[1] = 0  # the file leaves stored tile (row 0, col 1) out: a sparse Aperio level
    sparse = dataclasses.replace(tiles, counts=counts, _cache=OrderedDict())
    try:
        out = np.zeros((256, 256, 3), np.uint8)
        assert sparse.read(256, 0, 256, 256, out=out) is out and (out == 255).all()
        across = sparse.read(200, 0, 100, 10)
        assert (across[:, 56:] == 255).all() and np.array_equal(across[:, :56], tiles.read(200, 0, 56, 10))
    finally:
        sparse.close()
        tiles.close()


def test_a_wrong_out_is_a_clear_error(generated: Path) -> None:
    with open_slide(generated) as slide:
        read = slide.read_region_um
        with pytest.raises(
            ValueError, match=r"shape \(256, 256, 3\) for this tile, not a uint8 array of shape"
        ):
            read(0, 0, 128.0, 0.5, out=np.zeros((255, 256, 3), np.uint8))
        with pytest.raises(ValueError, match="not a float32 array"):
            read(0, 0, 128.0, 0.5, out=np.zeros((256, 256, 3), np.float32))
        with pytest.raises(ValueError, match="not a list"):
            read(0, 0, 128.0, 0.5, out=[])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="must be C-contiguous"):
            read(0, 0, 128.0, 0.5, out=np.zeros((256, 512, 3), np.uint8)[:, ::2])
        frozen = np.zeros((256, 256, 3), np.uint8)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            read(0, 0, 128.0, 0.5, out=frozen)
        with pytest.raises(ValueError, match=r"shape \(128, 128, 3\)"):  # a reduced tile is checked too
            read(0, 0, 128.0, 1.0, out=np.zeros((256, 256, 3), np.uint8))


def test_a_corrupt_or_cut_tile_is_a_slide_error_in_out(shared_data: Path, tmp_path: Path) -> None:
    path = damage_tiles(_cmu(shared_data), tmp_path / "bad.svs", [(2, 3)])  # tile (col 2, row 3)
    [tiles] = jpeg_levels(path).values()
    with open_slide(path) as slide:
        side = 240 * slide.mpp
        out = np.zeros((240, 240, 3), np.uint8)
        with pytest.raises(SlideError, match=rf"{path.name}: cannot read a .* region at level-0 x=480 y=720"):
            slide.read_region_um(480, 720, side, slide.mpp, out=out)
        # the tile stage: that tile alone is white and marked, its neighbour is read
        params = TileParams(tile_um=side, tile_px=240)
        chunk, bad = _read_chunk(slide, np.array([[240, 720], [480, 720]]), params)
        assert bad.tolist() == [False, True] and (chunk[1] == 255).all()
        assert np.array_equal(chunk[0], slide.read_region_um(240, 720, side, slide.mpp))
        rows, cols = np.divmod(np.arange(len(tiles.offsets)), tiles.n_cols)
        whole = (cols < tiles.width // 240) & (rows < tiles.height // 240)
        last = int(np.flatnonzero(whole)[np.argmax(tiles.offsets[whole])])  # the whole tile last in the file
        os.truncate(path, int(tiles.offsets[last]) + int(tiles.counts[last]) // 2)  # cut after opening
        row, col = divmod(last, tiles.n_cols)
        with pytest.raises(
            SlideError, match=f"{path.name}: .*stored tile {last} runs past the end of the file"
        ):
            slide.read_region_um(col * 240, row * 240, side, slide.mpp, out=out)
    tiles.close()


def test_the_colour_space_is_tifffiles(shared_data: Path, generated: Path) -> None:
    """`jpeg_colorspace` makes the choice tifffile's decode makes (tifffile.tifffile.jpeg_decode_colorspace,
    a function it does not export; skipped where a tifffile lacks it)."""
    import tifffile

    theirs = getattr(tifffile.tifffile, "jpeg_decode_colorspace", None)
    if theirs is None:
        pytest.skip("this tifffile has no jpeg_decode_colorspace")
    for path in (_cmu(shared_data), generated):
        with tifffile.TiffFile(path) as tif:
            for page in tif.pages:
                if page.is_tiled and page.compression == 7:
                    colorspace, outcolorspace = theirs(
                        page.photometric, page.planarconfig, page.extrasamples, page.is_jfif
                    )
                    assert outcolorspace == 2  # RGB out
                    assert jpeg_colorspace(int(page.photometric), bool(page.is_jfif)) == (
                        "RGB" if colorspace == 2 else None
                    )
    for photometric, jfif in ((2, True), (2, False), (6, True), (6, False)):
        colorspace, _ = theirs(photometric, 1, (), jfif)
        assert jpeg_colorspace(photometric, jfif) == ("RGB" if colorspace == 2 else None)


def test_the_backends_own_reads_are_copied_into_out(generated: Path) -> None:
    """Reads the direct path does not serve (tiffslide; openslide with direct_jpeg=False) fill `out` too,
    whole or partly outside the slide."""
    with open_slide(generated, backend="tiffslide") as tiff, open_slide(generated, direct_jpeg=False) as osl:
        for slide in (tiff, osl):
            assert not slide._direct
            _compare(slide, slide, 128.0, 0.5, _windows(*slide.dimensions, 256)[:9])

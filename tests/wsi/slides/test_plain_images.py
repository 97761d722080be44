"""Plain images (PNG, JPEG, TIFF in strips) as one-level slides: the resolution read from their metadata
only where it can be trusted, their pixels read unchanged through `Slide`, their pyramid made once in the
cache, and the refusals (no mpp, truncated, too large to decode whole) naming the file and the fix."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image
from s3_server import S3Server, use_s3
from s3_server import s3_server as s3_server  # a fixture

from wsi.core.errors import MissingMppError, SlideError
from wsi.slides.plain_images import image_pyramid, is_image_slide, read_image_header
from wsi.slides.plain_images.pyramid import pyramid_dir
from wsi.slides.slide import open_slide
from wsi.storage.settings import StorageSettings


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's pyramids in a cache of its own."""
    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _tissue(h: int = 600, w: int = 900, seed: int = 0) -> np.ndarray:
    """An RGB image with a pink-purple noisy block on white (every pixel distinct enough to compare)."""
    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), 255, np.uint8)
    block = rng.integers(0, 60, (h // 2, w // 2, 3))
    img[h // 4 : h // 4 + h // 2, w // 4 : w // 4 + w // 2] = (np.array([200, 120, 180]) - block).astype(
        np.uint8
    )
    return img


def _png(path: Path, img: np.ndarray, **kw: object) -> Path:
    Image.fromarray(img).save(path, **kw)
    return path


# ---------------------------------------------------------------------------------------------- metadata
def test_png_phys_in_metres_gives_the_mpp(tmp_path: Path) -> None:
    # 8 um/px = 125,000 px per metre; PIL writes pHYs in metres from dpi
    path = _png(tmp_path / "a.png", _tissue(), dpi=(25400 / 8, 25400 / 8))
    header = read_image_header(path)
    assert (header.format, header.width, header.height) == ("PNG", 900, 600)
    assert header.mpp == pytest.approx(8.0, rel=1e-4) and header.mpp_source == "PNG pHYs"
    with open_slide(path) as slide:
        assert slide.mpp == pytest.approx(8.0, rel=1e-4) and slide.mpp_source == "PNG pHYs"
        assert slide.vendor == "plain-png" and slide.dimensions == (900, 600)


@pytest.mark.parametrize("dpi", [72, 96, 300])
def test_screen_and_print_defaults_are_not_a_resolution(tmp_path: Path, dpi: int) -> None:
    path = _png(tmp_path / "a.png", _tissue(), dpi=(dpi, dpi))
    header = read_image_header(path)
    assert header.mpp is None and f"{dpi} dpi" in header.ignored
    with pytest.raises(
        MissingMppError, match=rf"a\.png: a plain PNG image of 900 x 600 px: its PNG pHYs of {dpi} dpi.*--mpp"
    ):
        open_slide(path)


def test_png_without_phys_is_refused_without_mpp(tmp_path: Path) -> None:
    path = _png(tmp_path / "a.png", _tissue())
    with pytest.raises(MissingMppError, match=r"a\.png: .*no resolution in its PNG metadata.*--mpp"):
        open_slide(path)
    with open_slide(path, mpp=2.0) as slide:
        assert (slide.mpp, slide.mpp_source) == (2.0, "given")


def test_jpeg_jfif_density_in_inches_and_centimetres(tmp_path: Path) -> None:
    img = _tissue()
    Image.fromarray(img).save(tmp_path / "in.jpg", dpi=(12700, 12700), quality=95)  # 2 um/px
    assert read_image_header(tmp_path / "in.jpg").mpp == pytest.approx(2.0)
    # JFIF unit 2 (dots per cm): 5000 dpcm = 2 um/px; PIL writes only inches, so patch the APP0 segment
    data = bytearray((tmp_path / "in.jpg").read_bytes())
    at = data.index(b"JFIF\x00") + 7  # after identifier and version: units, Xdensity, Ydensity
    data[at : at + 5] = bytes([2]) + (5000).to_bytes(2, "big") * 2
    (tmp_path / "cm.jpg").write_bytes(bytes(data))
    header = read_image_header(tmp_path / "cm.jpg")
    assert header.mpp == pytest.approx(2.0) and header.mpp_source == "JPEG JFIF density"


def test_jpeg_exif_resolution_when_jfif_has_no_unit(tmp_path: Path) -> None:
    exif = Image.Exif()
    exif[0x0128] = 3  # centimetres
    exif[0x011A] = exif[0x011B] = 40000.0  # 0.25 um/px: a microscope camera's own value
    Image.fromarray(_tissue()).save(tmp_path / "cam.jpg", exif=exif, quality=90)
    header = read_image_header(tmp_path / "cam.jpg")
    assert header.mpp == pytest.approx(0.25) and header.mpp_source == "JPEG EXIF resolution"
    exif[0x0128], exif[0x011A], exif[0x011B] = 2, 72.0, 72.0  # what every phone writes
    Image.fromarray(_tissue()).save(tmp_path / "phone.jpg", exif=exif, quality=90)
    header = read_image_header(tmp_path / "phone.jpg")
    assert header.mpp is None and "EXIF resolution of 72 dpi" in header.ignored


def test_stripped_tiff_is_a_plain_image_and_a_tiled_one_a_slide(tmp_path: Path) -> None:
    img = _tissue()
    strips = tmp_path / "strips.tif"
    tifffile.imwrite(
        strips, img, rowsperstrip=16, resolution=(10000 / 0.5, 10000 / 0.5), resolutionunit="CENTIMETER"
    )
    tiled = tmp_path / "tiled.tif"
    tifffile.imwrite(
        tiled, img, tile=(256, 256), resolution=(10000 / 0.5, 10000 / 0.5), resolutionunit="CENTIMETER"
    )
    assert is_image_slide(strips) and not is_image_slide(tiled)
    header = read_image_header(strips)
    assert header.mpp == pytest.approx(0.5) and header.whole_px == 900 * 16
    with open_slide(strips) as plain, open_slide(tiled) as slide:
        assert plain.vendor == "plain-tiff" and slide.vendor == "generic-tiff"
        assert plain.mpp == pytest.approx(0.5) and plain.mpp_source == "TIFF resolution tags"
        np.testing.assert_array_equal(plain.read_region_um(100, 50, 128, 0.5), img[50:306, 100:356])


# ------------------------------------------------------------------------------------------------ pixels
@pytest.mark.parametrize("backend", ["openslide", "tiffslide"])
def test_png_tiles_are_the_images_own_pixels(tmp_path: Path, backend: str) -> None:
    img = _tissue(1200, 1700)
    path = _png(tmp_path / "a.png", img)
    with open_slide(path, backend=backend, mpp=2.0) as slide:
        assert slide.dimensions == (1700, 1200) and slide.level_dimensions[0] == (1700, 1200)
        for x, y in [(0, 0), (311, 517), (1700 - 128, 1200 - 128)]:
            np.testing.assert_array_equal(
                slide.read_region_um(x, y, 256.0, 2.0), img[y : y + 128, x : x + 128]
            )
        # past the edge: white glass, as on a slide
        edge = slide.read_region_um(1650, 0, 256.0, 2.0)
        np.testing.assert_array_equal(edge[:, :50], img[:128, 1650:])
        assert (edge[:, 50:] == 255).all()
        # coarser tiles come from the pyramid, close to a resize of the image itself
        small = slide.read_region_um(400, 300, 512.0, 8.0)
        ref = np.asarray(Image.fromarray(img[300:556, 400:656]).resize((64, 64), Image.Resampling.BOX))
        assert np.abs(small.astype(int) - ref).mean() < 2.0


def test_jpeg_pixels_equal_pil_decode(tmp_path: Path) -> None:
    Image.fromarray(_tissue()).save(tmp_path / "a.jpg", quality=90)
    decoded = np.asarray(Image.open(tmp_path / "a.jpg").convert("RGB"))
    with open_slide(tmp_path / "a.jpg", mpp=1.0) as slide:
        np.testing.assert_array_equal(slide.read_region_um(200, 100, 300.0, 1.0), decoded[100:400, 200:500])


def test_alpha_is_white_glass_and_grey_becomes_rgb(tmp_path: Path) -> None:
    img = _tissue(300, 300)
    rgba = np.dstack([img, np.full((300, 300), 255, np.uint8)])
    rgba[:, :150, 3] = 0  # left half transparent: no data
    _png(tmp_path / "rgba.png", rgba)
    grey = img[..., 1]
    _png(tmp_path / "grey.png", grey)
    with open_slide(tmp_path / "rgba.png", mpp=1.0) as a, open_slide(tmp_path / "grey.png", mpp=1.0) as g:
        tile = a.read_region_um(0, 0, 300.0, 1.0)
        assert (tile[:, :150] == 255).all()
        np.testing.assert_array_equal(tile[:, 150:], img[:, 150:])
        np.testing.assert_array_equal(
            g.read_region_um(0, 0, 300.0, 1.0), np.repeat(grey[..., None], 3, axis=2)
        )


# ------------------------------------------------------------------------------------------------- cache
def test_the_pyramid_is_made_once_and_again_when_the_image_changes(tmp_path: Path, _cache: Path) -> None:
    path = _png(tmp_path / "a.png", _tissue())
    with open_slide(path, mpp=1.0) as slide:
        first = slide.file
    assert isinstance(first, Path) and first.is_relative_to(_cache / "pyramids")
    made = first.stat().st_mtime_ns
    with open_slide(path, mpp=1.0) as slide:
        assert slide.file == first and first.stat().st_mtime_ns == made  # found, not made again
    _png(path, _tissue(seed=5))
    os.utime(path, ns=(made + 10**9, made + 10**9))
    with open_slide(path, mpp=1.0) as slide:
        assert slide.file != first  # another image: another pyramid
        np.testing.assert_array_equal(slide.read_region_um(0, 0, 600.0, 1.0), _tissue(seed=5)[:600, :600])


def test_least_recently_used_pyramids_go_but_never_one_being_read(tmp_path: Path, _cache: Path) -> None:
    settings = StorageSettings(cache_dir=_cache, cache_gb=1e-9)  # every pyramid is over the limit
    paths = [_png(tmp_path / f"{i}.png", _tissue(seed=i)) for i in range(3)]
    held = []
    for path in paths[:2]:
        pyramid, hold = image_pyramid(path, read_image_header(path), settings=settings)
        held.append((pyramid, hold))
    held[1][1].close()  # the second is no longer read; the first still is
    image_pyramid(paths[2], read_image_header(paths[2]), settings=settings)[1].close()
    assert held[0][0].is_file()  # held: kept although least recently used
    assert not held[1][0].is_file()  # not held: removed
    assert (pyramid_dir(paths[2], settings) / "pyramid.tif").is_file()  # the one just made stays
    held[0][1].close()


# ------------------------------------------------------------------------------------------------ refusals
def test_a_truncated_image_is_an_error_naming_it(tmp_path: Path) -> None:
    buf = io.BytesIO()
    Image.fromarray(_tissue()).save(buf, format="JPEG", quality=90)
    (tmp_path / "cut.jpg").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(SlideError, match=r"cut\.jpg: cannot decode the image .*complete"):
        open_slide(tmp_path / "cut.jpg", mpp=1.0)


def test_an_image_only_decodable_whole_is_refused_above_the_bound(tmp_path: Path) -> None:
    import pyvips

    Image.fromarray(_tissue()).save(tmp_path / "prog.jpg", progressive=True, quality=90)
    pyvips.Image.new_from_array(_tissue()).pngsave(str(tmp_path / "inter.png"), interlace=True)
    inter = read_image_header(tmp_path / "inter.png")
    assert inter.whole_px == 900 * 600 and inter.whole_why == "an interlaced PNG"
    header = read_image_header(tmp_path / "prog.jpg")
    assert header.whole_px == 900 * 600 and header.whole_why == "a progressive JPEG"
    with pytest.raises(
        SlideError, match=r"prog\.jpg: a progressive JPEG of 900 x 600 px can only be decoded whole"
    ):
        image_pyramid(tmp_path / "prog.jpg", header, max_whole_px=100_000)
    baseline = tmp_path / "base.jpg"
    Image.fromarray(_tissue()).save(baseline, quality=90)
    assert read_image_header(baseline).whole_px == 900 * 16  # a band of rows: any size is fine
    pyramid, hold = image_pyramid(baseline, read_image_header(baseline), max_whole_px=100_000)
    hold.close()
    assert pyramid.is_file()


def test_not_an_image_is_named(tmp_path: Path) -> None:
    (tmp_path / "x.png").write_bytes(b"GIF89a" + bytes(100))
    with pytest.raises(SlideError, match=r"x\.png: not a PNG, JPEG or TIFF image"):
        open_slide(tmp_path / "x.png", mpp=1.0)


# ------------------------------------------------------------------------------------- the two uses apart
def test_a_plain_image_is_a_slide_when_named_and_an_image_to_an_image_task(
    tmp_path: Path, make_slide
) -> None:
    """Folder search finds whole-slide files only: QC pictures beside slides are not tiled; the same
    folder given to an image task (dermoscopy, fundus) finds its JPEGs and PNGs as images."""
    from wsi.pipelines.inputs.images import ImageInput
    from wsi.slides.sources import find_slides

    folder = tmp_path / "mixed"
    folder.mkdir()
    slide = make_slide(name="s", size_um=400.0, mpp=0.5, seed=2)
    (folder / "s.svs").write_bytes(slide.path.read_bytes())
    _png(folder / "qc.png", _tissue())
    Image.fromarray(_tissue()).save(folder / "photo.jpg")
    assert [s.slide_id for s in find_slides([folder])] == ["s"]
    named = find_slides([folder / "qc.png", folder / "photo.jpg"])
    assert [(s.slide_id, s.path) for s in named] == [
        ("qc", folder / "qc.png"),
        ("photo", folder / "photo.jpg"),
    ]
    assert set(ImageInput().find([folder])) == {"qc", "photo"}


def test_wsi_info_describes_a_plain_image_from_its_header(tmp_path: Path, _cache: Path) -> None:
    from click.testing import CliRunner

    from wsi.cli.main import cli

    path = _png(tmp_path / "a.png", _tissue(), dpi=(25400 / 8, 25400 / 8))
    result = CliRunner().invoke(cli, ["info", str(path), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["kind"] == "plain PNG image, read as a one-level slide" and info["size_px"] == "900 x 600"
    assert info["mpp"] == pytest.approx(8.0, rel=1e-4) and info["mpp_source"] == "PNG pHYs"
    assert info["size_mm"] == "7.20 x 4.80" and info["levels"] == 1
    assert not (_cache / "pyramids").exists()  # described, not converted
    bare = CliRunner().invoke(cli, ["info", str(_png(tmp_path / "b.png", _tissue())), "--json"])
    assert (
        "unknown: no resolution in its PNG metadata; pass the resolution with --mpp"
        in json.loads(bare.output)["mpp"]
    )


def test_wsi_view_shows_a_plain_image_from_its_pyramid(tmp_path: Path) -> None:
    from wsi.view.dzi import open_deepzoom

    img = _tissue(600, 900)
    path = _png(tmp_path / "a.png", img)
    view = open_deepzoom(path, "openslide")
    try:
        assert 'Width="900"' in view.dzi() and 'Height="600"' in view.dzi()
        top = view.generator.level_count - 1  # full resolution: the first 254 px tile (+1 px overlap)
        tile = np.asarray(Image.open(io.BytesIO(view.tile_jpeg(top, 0, 0))).convert("RGB"))
        assert tile.shape == (255, 255, 3)
        assert np.abs(tile.astype(int) - img[:255, :255]).mean() < 3  # JPEG q80 of the same pixels
    finally:
        view.close()


@pytest.mark.parametrize("backend", ["openslide", "tiffslide"])
def test_a_plain_image_in_the_bucket_is_a_slide(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """A PNG named by its URL (a real S3 server, tests/helpers/s3_server.py): found as a slide, copied to
    the cache and read from its pyramid there, with either backend (a PNG has no ranges to read in place)."""
    from wsi.slides.sources import find_slides

    use_s3(monkeypatch, s3_server, tmp_path / "cache")
    s3 = s3_server
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 255, (300, 500, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "thumb.png")
    bucket = s3.bucket()
    s3.client().upload_file(str(tmp_path / "thumb.png"), bucket, "images/thumb.png")
    url = f"s3://{bucket}/images/thumb.png"
    [source] = find_slides([url])
    assert (source.slide_id, str(source.path)) == ("thumb", url)
    with open_slide(url, backend=backend, mpp=8.0) as slide:
        assert slide.path == url and slide.vendor == "plain-png" and slide.dimensions == (500, 300)
        np.testing.assert_array_equal(slide.read_region_um(80, 40, 800.0, 8.0), pixels[40:140, 80:180])

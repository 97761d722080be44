"""JPEG tiles whose stream contradicts the container's colour space (issue 29, item 4).

A DICOM series of JFIF (YCbCr 4:2:0) frames labelled `PhotometricInterpretation = RGB` is read by
openslide without the colour transform (salmon and green tissue, every tile "ink"). The series here are
built with pydicom from the real pixels of CMU-1-Small-Region.svs (../shared), so every reader path
(Slide, tiling + QC picture, the embed feed, `wsi view`) is compared with the SVS of the same pixels.
TIFFs with an RGB Photometric tag over YCbCr tiles are checked the same way, with both backends and the
embed stage's device decoder.
"""

from __future__ import annotations

import io
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from wsi.cli.main import cli
from wsi.core.errors import SlideError
from wsi.formats.tile_file import read_tile_file
from wsi.pipelines.embed.batches import SlideTiles
from wsi.pipelines.embed.device_decode import DeviceDecoder, RawSlideReader
from wsi.pipelines.embed.feed import BatchReader
from wsi.slides.jpeg_colour import libjpeg_colour, parse_header, stream_colour, ycbcr_to_rgb
from wsi.slides.slide import open_slide
from wsi.slides.slide_info import slide_info
from wsi.view.dzi import open_deepzoom

pytest.importorskip("pydicom", minversion="3.0")
from wsi.synthetic.dicom import write_dicom_series

MPP = 0.499  # CMU-1-Small-Region.svs
FEW_UNITS = 3.0  # 0-255: channel means of a JPEG q90 re-encode of the same pixels
SVS = "slides/CMU-1-Small-Region.svs"


def _jpeg(pixels: np.ndarray, subsampling: int = 2) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90, subsampling=subsampling)
    return buf.getvalue()


def _strip_app0(stream: bytes) -> bytes:
    assert stream[2:4] == b"\xff\xe0"
    return stream[:2] + stream[4 + int.from_bytes(stream[4:6], "big") :]


def _abbreviated(stream: bytes) -> bytes:
    """The stream without its DQT and DHT segments, as a TIFF tile whose tables sit in JPEGTables."""
    out, pos = bytearray(stream[:2]), 2
    while stream[pos + 1] != 0xDA:  # up to the scan
        length = int.from_bytes(stream[pos + 2 : pos + 4], "big")
        if stream[pos + 1] not in (0xDB, 0xC4):
            out += stream[pos : pos + 2 + length]
        pos += 2 + length
    return bytes(out + stream[pos:])


@pytest.fixture(scope="module")
def cmu(shared_data: Path) -> np.ndarray:
    """Level 0 of the SVS (2220 x 2967 px), as openslide reads it."""
    with open_slide(shared_data / SVS) as slide:
        return slide.read_level(0, 0, 0, *slide.dimensions)


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory, cmu: np.ndarray) -> dict[str, Path]:
    """The same two-level series (level 1: 4x smaller, 4:2:2) labelled RGB (wrong) and YBR_FULL_422."""
    root = tmp_path_factory.mktemp("dicom-colour")
    levels = [cmu, np.asarray(Image.fromarray(cmu).reduce(4))]
    out = {}
    for name, photometric in (("mislabelled", "RGB"), ("labelled", "YBR_FULL_422")):
        write_dicom_series(root / name, levels, mpp=MPP, photometric=photometric)  # type: ignore[arg-type]
        out[name] = root / name
    return out


def _fresh(folder: Path, tmp_path: Path) -> Path:
    """A copy under a new path (the colour check, and its one log line, happen once per file and process)."""
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    return copy / "level0.dcm"


# --------------------------------------------------------------------------------------- JPEG streams
def test_stream_markers_say_what_the_stream_holds(shared_data: Path, cmu: np.ndarray) -> None:
    from imagecodecs import jpeg8_encode

    crop = cmu[:64, :64]
    jfif = _jpeg(crop)
    cases = {
        "jfif 4:2:0": (jfif, "ycbcr"),
        "no marker, 4:2:0": (_strip_app0(jfif), "ycbcr"),  # subsampled chroma: luma + chroma
        "no marker, 4:4:4, ids 1,2,3": (_strip_app0(_jpeg(crop, 0)), None),  # ids alone do not say
        "abbreviated, no marker, 4:2:0": (_abbreviated(_strip_app0(jfif)), "ycbcr"),  # YCbCr SVS + tables
        "adobe rgb": (bytes(jpeg8_encode(crop, level=90, colorspace="RGB", outcolorspace="RGB")), "rgb"),
        "adobe ycbcr": (
            jfif[:2] + b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x01" + _strip_app0(jfif)[2:],
            "ycbcr",
        ),
    }
    for name, (stream, expected) in cases.items():
        header = parse_header(stream)
        assert header is not None, name
        assert stream_colour(header)[0] == expected, name
    import tifffile  # a real Aperio tile: ids 0,1,2, 4:4:4, no marker: only the TIFF tag can tell

    with tifffile.TiffFile(shared_data / SVS) as tif:
        page = tif.pages[0]
        tif.filehandle.seek(page.dataoffsets[0])
        header = parse_header(tif.filehandle.read(page.databytecounts[0]))
    assert header is not None and [c[0] for c in header.components] == [0, 1, 2]
    assert stream_colour(header)[0] is None and libjpeg_colour(header) == "ycbcr"  # what decoders guess
    assert parse_header(b"not a jpeg") is None
    for n in range(0, len(jfif), 7):  # a cut stream: a header or None, never an exception
        parse_header(jfif[:n])
    assert parse_header(jfif[: jfif.index(b"\xff\xc0") + 8]) is None  # cut inside the frame header


def test_the_conversion_is_libjpeg_turbos_own_bit_for_bit(cmu: np.ndarray) -> None:
    for subsampling in (0, 1, 2):
        stream = _jpeg(cmu[:512, :768], subsampling)
        rgb = np.asarray(Image.open(io.BytesIO(stream)).convert("RGB"))  # libjpeg-turbo's conversion
        raw = Image.open(io.BytesIO(stream))
        raw.draft("YCbCr", raw.size)  # the upsampled Y'CbCr planes, as openslide hands them over
        planes = np.asarray(raw)
        assert raw.mode == "YCbCr" and np.abs(planes.astype(int) - rgb).mean() > 20
        np.testing.assert_array_equal(ycbcr_to_rgb(planes), rgb)


# --------------------------------------------------------------------------------------------- DICOM
def test_the_mislabelled_series_reads_as_the_svs_does(
    series: dict[str, Path], cmu: np.ndarray, shared_data: Path, tmp_path: Path, caplog
) -> None:
    import openslide

    path = _fresh(series["mislabelled"], tmp_path)
    raw = np.asarray(openslide.OpenSlide(path).read_region((0, 0), 0, (1024, 1024)))[..., :3]
    assert np.abs(raw.mean(axis=(0, 1)) - cmu[:1024, :1024].mean(axis=(0, 1))).max() > 10  # the bug
    with caplog.at_level(logging.WARNING):
        mislabelled = open_slide(path)
        open_slide(path).close()  # a second open: no second line
    lines = [r.getMessage() for r in caplog.records if "YCbCr" in r.getMessage()]
    assert len(lines) == 1 and str(path) in lines[0] and "JFIF" in lines[0], lines
    labelled = open_slide(series["labelled"] / "level0.dcm")
    svs = open_slide(shared_data / SVS)
    with mislabelled, labelled, svs:
        assert mislabelled.colour_fix.levels == {0, 1} and not labelled.colour_fix
        assert "JFIF" in slide_info(path)["colour"] and "colour" not in slide_info(labelled.path)  # wsi info
        for level, (w, h) in enumerate(mislabelled.level_dimensions):  # exactly the right series' pixels
            got = mislabelled.read_level(level, 0, 0, w, h)
            np.testing.assert_array_equal(got, labelled.read_level(level, 0, 0, w, h))
        for target_mpp in (1.0, 2.0):  # level 0 resized; level 1 (the SVS has no level 1: its level 0)
            for x, y in ((0, 0), (1000, 1200), (1500, 2400)):
                ours = mislabelled.read_region_um(x, y, 256, target_mpp).astype(float)
                theirs = svs.read_region_um(x, y, 256, target_mpp).astype(float)
                assert np.abs(ours.mean(axis=(0, 1)) - theirs.mean(axis=(0, 1))).max() < FEW_UNITS
                if target_mpp == 1.0:  # the same level-0 pixels, re-encoded (q90 4:2:0): close pixel by pixel
                    assert np.abs(ours - theirs).mean() < 2 * FEW_UNITS


def test_tiling_the_mislabelled_series_keeps_the_svs_tiles(
    series: dict[str, Path], shared_data: Path, tmp_path: Path
) -> None:
    svs_folder = tmp_path / "svs"
    svs_folder.mkdir()
    (svs_folder / "cmu.svs").symlink_to(shared_data / SVS)
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["tile", str(svs_folder), str(series["mislabelled"]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    ours, theirs = read_tile_file(out / "tiles" / "mislabelled.h5"), read_tile_file(out / "tiles" / "cmu.h5")
    assert ours.meta.counts.n_ink == 0 and ours.meta.counts.n_tissue == theirs.meta.counts.n_tissue
    assert len(theirs) >= 8 and sorted(map(tuple, ours.coords.tolist())) == sorted(
        map(tuple, theirs.coords.tolist())
    )
    qc_ours = np.asarray(Image.open(out / "qc" / "mislabelled.png").convert("RGB"), float)
    qc_theirs = np.asarray(Image.open(out / "qc" / "cmu.png").convert("RGB"), float)
    assert qc_ours.shape == qc_theirs.shape
    assert np.abs(qc_ours.mean(axis=(0, 1)) - qc_theirs.mean(axis=(0, 1))).max() < FEW_UNITS


def test_the_embed_feed_and_the_viewer_see_the_right_colours(series: dict[str, Path]) -> None:
    coords = np.array([[0, 0], [1026, 1026], [1539, 2052]], np.int64)

    def feed(name: str) -> np.ndarray:
        st = SlideTiles(
            slide_id=name, slide_path=str(series[name] / "level0.dcm"), backend="openslide", mpp=MPP,
            tile_um=256.0, target_mpp=1.0, tile_px=256, coords_px=coords, decode="device",
        )  # fmt: skip
        batch = BatchReader([st], batch_size=4)[0]  # not a TIFF: read by read_region_um
        assert batch.raw is None and batch.ok.all()
        return batch.tiles.numpy()

    np.testing.assert_array_equal(feed("mislabelled"), feed("labelled"))
    views = [open_deepzoom(series[name] / "level0.dcm", "openslide") for name in ("mislabelled", "labelled")]
    try:
        top = views[0].generator.level_count - 1
        assert views[0].tile_jpeg(top, 1, 2) == views[1].tile_jpeg(top, 1, 2)  # level 0: the same pixels
        # level 1 (downsample 3.9993): openslide shifts it by a fraction of a pixel, interpolating the raw
        # Y'CbCr before the conversion: equal up to rounding where the conversion clips
        ours, theirs = (np.asarray(v.generator.get_tile(top - 2, (1, 1)), float) for v in views)
        assert np.abs(ours - theirs).mean() < 0.5
    finally:
        for view in views:
            view.close()


def test_rgb_frames_labelled_ycbcr_fail_with_what_to_do(cmu: np.ndarray, tmp_path: Path) -> None:
    write_dicom_series(tmp_path / "s", [cmu[:512, :512]], mpp=MPP, stream="adobe-rgb")  # says YBR_FULL_422
    with pytest.raises(
        SlideError, match=r"hold RGB \(an Adobe APP14 marker.*PhotometricInterpretation to RGB"
    ):
        open_slide(tmp_path / "s" / "level0.dcm")


def test_without_pydicom_the_unchecked_series_is_named(
    series: dict[str, Path], tmp_path: Path, monkeypatch, caplog
) -> None:
    path = _fresh(series["labelled"], tmp_path)
    monkeypatch.setitem(sys.modules, "pydicom", None)
    with caplog.at_level(logging.WARNING), open_slide(path) as slide:
        assert not slide.colour_fix
    assert any(
        "pydicom is not installed" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records
    )


# ---------------------------------------------------------------------------------------------- TIFF
def _tiff(path: Path, pixels: np.ndarray, photometric: int, tiles: list[bytes]) -> Path:
    """A one-level tiled JPEG TIFF of the given tile streams, its Photometric tag set afterwards (tifffile
    writes JPEG as YCbCr)."""
    import tifffile

    h, w, _ = pixels.shape
    with tifffile.TiffWriter(path) as tw:
        tw.write(
            iter(tiles), shape=(h, w, 3), dtype="uint8", tile=(256, 256), compression="jpeg",
            photometric="ycbcr", subsampling=(2, 2), resolution=(1e4 / MPP, 1e4 / MPP),
            resolutionunit="CENTIMETER",
        )  # fmt: skip
    with tifffile.TiffFile(path, mode="r+") as tif:
        tif.pages[0].tags["PhotometricInterpretation"].overwrite(photometric)
    return path


def _grid(pixels: np.ndarray) -> list[np.ndarray]:
    return [
        pixels[y : y + 256, x : x + 256]
        for y in range(0, pixels.shape[0], 256)
        for x in range(0, pixels.shape[1], 256)
    ]


def _decoded(pixels: np.ndarray, tiles: list[bytes]) -> np.ndarray:
    """The tiles decoded as their streams say (Pillow, libjpeg-turbo), assembled."""
    out = np.empty_like(pixels)
    cols = pixels.shape[1] // 256
    for i, stream in enumerate(tiles):
        y, x = divmod(i, cols)
        out[y * 256 : (y + 1) * 256, x * 256 : (x + 1) * 256] = np.asarray(
            Image.open(io.BytesIO(stream)).convert("RGB")
        )
    return out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torchvision's decode notice
@pytest.mark.parametrize(
    ("name", "photometric", "strip", "openslide_wrong", "tiffslide_wrong"),
    [
        ("rgb-tag-jfif-tiles", 2, False, True, False),  # tifffile follows a JFIF marker
        ("rgb-tag-bare-420-tiles", 2, True, True, True),  # no marker: both force RGB
        ("ycbcr-tag-jfif-tiles", 6, False, False, False),  # labelled right: nothing to do
    ],
)
def test_tiffs_with_ycbcr_tiles_read_right_with_both_backends_and_the_device_decoder(
    cmu: np.ndarray, tmp_path: Path, name: str, photometric: int, strip: bool, openslide_wrong: bool,
    tiffslide_wrong: bool,
) -> None:  # fmt: skip
    import openslide
    import tiffslide

    pixels = cmu[:768, :1024]
    tiles = [_strip_app0(_jpeg(t)) if strip else _jpeg(t) for t in _grid(pixels)]
    path = _tiff(tmp_path / f"{name}.tiff", pixels, photometric, tiles)
    expected = _decoded(pixels, tiles)
    raw = {
        "openslide": np.asarray(openslide.OpenSlide(path).read_region((0, 0), 0, (1024, 768)))[..., :3],
        "tiffslide": tiffslide.TiffSlide(path).read_region((0, 0), 0, (1024, 768), as_array=True)[..., :3],
    }
    for backend, wrong in (("openslide", openslide_wrong), ("tiffslide", tiffslide_wrong)):
        assert (np.abs(raw[backend].astype(int) - expected).mean() > 20) == wrong, backend  # what each does
        with open_slide(path, backend=backend) as slide:
            assert bool(slide.colour_fix) == wrong
            np.testing.assert_array_equal(slide.read_level(0, 0, 0, 1024, 768), expected)
    _check_device_decode(path, "cpu")


def _check_device_decode(path: Path, device: str) -> None:
    """The embed stage's device decoder decodes the tiles as their streams say, as read_region_um does."""
    st = SlideTiles(
        slide_id=path.stem, slide_path=str(path), backend="openslide", mpp=MPP, tile_um=128.0,
        target_mpp=0.5, tile_px=256, coords_px=np.array([[0, 0], [300, 200], [700, 500]], np.int64),
        decode="device",
    )  # fmt: skip
    reader = RawSlideReader.open(st)
    assert reader is not None and not reader.lv.rgb  # no Adobe RGB marker put in: the streams decide
    raw_batch = reader.read(0, st.n)
    reader.close()
    with DeviceDecoder(device) as decoder:
        got, ok = decoder.decode(raw_batch)
    with open_slide(path) as slide:
        ref = np.stack([slide.read_region_um(int(x), int(y), 128.0, 0.5) for x, y in st.coords_px])
    assert ok.all() and np.abs(got.cpu().numpy().astype(float) - ref).mean(axis=(1, 2, 3)).max() < FEW_UNITS


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nvjpeg_decodes_ycbcr_tiles_under_an_rgb_tag_as_ycbcr(cmu: np.ndarray, tmp_path: Path) -> None:
    pixels = cmu[:768, :1024]
    for strip in (False, True):
        tiles = [_strip_app0(_jpeg(t)) if strip else _jpeg(t) for t in _grid(pixels)]
        _check_device_decode(_tiff(tmp_path / f"nvjpeg-{strip}.tiff", pixels, 2, tiles), "cuda")


def test_rgb_tiles_under_a_ycbcr_tag_fail_on_openslide_and_read_on_tiffslide(
    cmu: np.ndarray, tmp_path: Path
) -> None:
    from imagecodecs import jpeg8_encode

    pixels = cmu[:512, :512]
    tiles = [bytes(jpeg8_encode(t, level=90, colorspace="RGB", outcolorspace="RGB")) for t in _grid(pixels)]
    path = _tiff(tmp_path / "adobe.tiff", pixels, 6, tiles)
    with pytest.raises(SlideError, match="--backend tiffslide"):
        open_slide(path)
    with open_slide(path, backend="tiffslide") as slide:
        assert not slide.colour_fix
        np.testing.assert_array_equal(slide.read_level(0, 0, 0, 512, 512), _decoded(pixels, tiles))


@pytest.mark.parametrize("backend", ["openslide", "tiffslide"])
def test_aperio_rgb_tiles_are_left_as_they_are(shared_data: Path, backend: str) -> None:
    with open_slide(shared_data / SVS, backend=backend) as slide:
        assert not slide.colour_fix  # no marker, 4:4:4: the Photometric tag (RGB) decides, as before

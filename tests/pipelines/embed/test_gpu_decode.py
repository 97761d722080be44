"""Device decode (pipelines/embed/device_decode/): raw JPEG tiles decoded, assembled and resized by torch
give the tiles `Slide.read_region_um` gives, with the right colours; damaged tiles and non-JPEG slides
fall back to the CPU path. Run with device="cpu" (libjpeg-turbo through the same torchvision call)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.core.errors import ConfigError
from wsi.formats.bags import read_bag
from wsi.formats.tile_file import read_tile_file, write_tile_file
from wsi.pipelines.embed import EmbedOptions, embed_tiles
from wsi.pipelines.embed.batches import SlideTiles
from wsi.pipelines.embed.device_decode import DeviceDecoder, RawSlideReader, complete_jpeg, decode_ahead
from wsi.pipelines.embed.engine import resolve_decode
from wsi.pipelines.embed.feed import BatchReader
from wsi.pipelines.tile.stage import tile_slides
from wsi.slides.slide import open_slide
from wsi.slides.sources import find_slides
from wsi.tiling.params import TileParams

MAX_MEAN_ABS = 3.0  # 0-255; JPEG decoders and resampling rounding differ slightly
ENCODER = "timm:test_resnet"
OPTIONS = EmbedOptions(
    encoder=ENCODER, random_init=True, input_px=64, batch_size=8, readers=0, dtype="float32", threads=1
)
BAGS = "features/timm-test_resnet"


def _tiles(path: Path, mpp: float, coords: list[tuple[int, int]], tile_um: float, tile_px: int,
           *, slide_mpp: float | None = None) -> SlideTiles:  # fmt: skip
    return SlideTiles(
        slide_id=path.stem, slide_path=str(path), backend="openslide", mpp=slide_mpp or mpp,
        tile_um=tile_um, target_mpp=tile_um / tile_px, tile_px=tile_px,
        coords_px=np.asarray(coords, np.int64).reshape(-1, 2), decode="device",
    )  # fmt: skip


def _device_tiles(st: SlideTiles) -> tuple[np.ndarray, np.ndarray, object]:
    reader = RawSlideReader.open(st)
    assert reader is not None, "a tiled JPEG TIFF must be read raw"
    try:
        raw = reader.read(0, st.n)
    finally:
        reader.close()
    with DeviceDecoder("cpu") as decoder:
        tiles, ok = decoder.decode(raw)
    assert tiles.shape == (st.n, st.tile_px, st.tile_px, 3) and tiles.dtype == torch.uint8
    assert tiles.is_contiguous()  # like the CPU path: the encoder's permute then gives channels_last
    return tiles.numpy(), ok.numpy(), raw


def _cpu_tiles(st: SlideTiles, mpp: float | None = None) -> np.ndarray:
    with open_slide(st.slide_path, mpp=mpp) as slide:
        return np.stack(
            [slide.read_region_um(int(x), int(y), st.tile_um, st.target_mpp) for x, y in st.coords_px]
        )


def _mean_abs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.astype(np.float32) - b.astype(np.float32)).mean(axis=(1, 2, 3))


@pytest.mark.parametrize(
    ("mpp", "tile_px"),
    [(0.25, 256), (0.46, 256), (0.5, 256), (0.5, 224), (0.25, 224)],
)
def test_device_tiles_equal_read_region_um(make_slide, mpp: float, tile_px: int) -> None:
    slide = make_slide(name=f"gd-{mpp}", size_um=(700.0, 560.0), mpp=mpp, seed=1)
    w, h = slide.width_px, slide.height_px
    step = round(256 / mpp)
    grid = [(x, y) for y in range(0, h, step) for x in range(0, w, step)]  # last row/column: edge tiles
    off_grid = [(37, 11), (w - step // 3, 5), (3, h - step // 2), (w - 10, h - 10)]  # partly outside
    st = _tiles(slide.path, mpp, grid + off_grid, 256.0, tile_px)
    got, ok, _ = _device_tiles(st)
    expected = _cpu_tiles(st)
    assert ok.all()
    diff = _mean_abs(got, expected)
    assert diff.max() < MAX_MEAN_ABS, diff
    assert diff.mean() < 1.0, diff
    # edge tiles: the part outside the slide is white glass, as read_region_um pads it
    corner = got[-1]
    assert (corner[-64:, -64:] == 255).all() and (expected[-1][-64:, -64:] == 255).all()


def test_region_plans_cover_copy_reduce_and_resample(make_slide) -> None:
    pyramid = make_slide(name="gd-0.25", size_um=(700.0, 560.0), mpp=0.25, seed=1)
    flat = make_slide(name="gd-flat", size_um=(600.0, 500.0), mpp=0.25, seed=2, n_levels=1)
    coords = [(0, 0), (1024, 1024), (2000, 1700)]
    # 1 um/px from the 1 um/px level: copy; from a slide without a pyramid: 4x4 means; 224 px: resampled
    for slide, tile_px, kind in ((pyramid, 256, 0), (flat, 256, 1), (pyramid, 224, 2), (flat, 224, 2)):
        st = _tiles(slide.path, 0.25, coords, 256.0, tile_px)
        got, ok, raw = _device_tiles(st)
        assert set(raw.kind.tolist()) == {kind}  # type: ignore[attr-defined]
        assert ok.all() and _mean_abs(got, _cpu_tiles(st)).max() < MAX_MEAN_ABS


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torchvision's decode notice
def test_real_aperio_rgb_jpeg_with_tables_has_the_right_colours(shared_data: Path) -> None:
    path = shared_data / "slides" / "CMU-1-Small-Region.svs"
    coords = [(x, y) for y in range(0, 2220, 700) for x in range(0, 2967, 900)]
    for tile_um, tile_px in ((256.0, 256), (128.0, 256), (112.0, 224)):
        st = _tiles(path, 0.499, coords, tile_um, tile_px, slide_mpp=None)
        st = dataclasses.replace(st, mpp=open_slide(path).mpp)
        got, ok, _ = _device_tiles(st)
        expected = _cpu_tiles(st)
        assert ok.all() and _mean_abs(got, expected).max() < MAX_MEAN_ABS
        # channel means agree closely: no R/B swap, no YCbCr taken for RGB
        np.testing.assert_allclose(got.mean(axis=(0, 1, 2)), expected.mean(axis=(0, 1, 2)), atol=1.0)

    # the Adobe marker is what makes these RGB tiles decode right (decoders assume YCbCr without it)
    import tifffile
    from torchvision.io import decode_jpeg

    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        assert page.jpegtables is not None and int(page.photometric) == 2  # abbreviated RGB JPEG
        with open(path, "rb") as fh:
            fh.seek(page.dataoffsets[5])
            tile = fh.read(page.databytecounts[5])
    with open_slide(path) as slide:
        ref = slide.read_level(0, 5 * 240, 0, 240, 240).astype(np.float32)
    right = decode_jpeg(
        torch.frombuffer(bytearray(complete_jpeg(tile, page.jpegtables, True)), dtype=torch.uint8)
    )
    wrong = decode_jpeg(
        torch.frombuffer(bytearray(complete_jpeg(tile, page.jpegtables, False)), dtype=torch.uint8)
    )
    assert np.abs(right.permute(1, 2, 0).numpy() - ref).mean() < 1.0
    assert np.abs(wrong.permute(1, 2, 0).numpy() - ref).mean() > 10.0


def test_a_stream_that_does_not_decode_sends_its_tiles_to_read_region_um(make_slide) -> None:
    slide = make_slide(name="gd-0.5", size_um=(700.0, 560.0), mpp=0.5, seed=1)
    st = _tiles(slide.path, 0.5, [(0, 0), (512, 0), (1024, 512)], 256.0, 256)
    reader = RawSlideReader.open(st)
    assert reader is not None
    raw = reader.read(0, st.n)
    reader.close()
    assert raw.table[0].ravel().tolist() == [0] and 0 not in raw.table[1:]  # stream 0 feeds tile 0 only
    raw.data[400:600] = 0  # inside stream 0's Huffman tables: the decoder refuses it
    with DeviceDecoder("cpu") as decoder:
        got, ok = decoder.decode(raw)
    assert ok.all()  # the file itself is intact: read_region_um reads the tile
    assert _mean_abs(got.numpy(), _cpu_tiles(st)).max() < MAX_MEAN_ABS


def test_a_decoder_with_wrong_colours_is_caught_and_the_slide_read_on_the_cpu(shared_data: Path) -> None:
    path = shared_data / "slides" / "CMU-1-Small-Region.svs"
    st = _tiles(path, 0.499, [(0, 0), (1000, 800), (2000, 1500)], 256.0, 256)
    reader = RawSlideReader.open(st)
    assert reader is not None and reader.lv.rgb
    reader.lv = dataclasses.replace(reader.lv, rgb=False)  # as if the decoder ignored the RGB marker
    raw = reader.read(0, st.n)
    reader.close()
    with DeviceDecoder("cpu") as decoder:
        got, ok = decoder.decode(raw)
    assert ok.all()
    np.testing.assert_array_equal(got.numpy(), _cpu_tiles(st))  # read by read_region_um itself


def test_jpeg2000_slide_falls_back_to_the_cpu_path(shared_data: Path) -> None:
    path = shared_data / "slides" / "tcga-cr-7395-01a-01-ts1.svs"
    st = _tiles(path, 0.25, [(0, 0), (2048, 1024)], 256.0, 256, slide_mpp=0.25)
    assert RawSlideReader.open(st) is None
    batch = BatchReader([st], batch_size=4)[0]
    assert batch.raw is None and batch.ok.all()
    np.testing.assert_array_equal(batch.tiles.numpy(), _cpu_tiles(st, mpp=0.25))


def test_broken_jpeg_tile_is_counted_and_the_rest_embeds_like_the_cpu_path(
    make_slide, tmp_path: Path
) -> None:
    # 128 um tiles at 0.5 um/px line up with the 256 px JPEG tiles: damaging JPEG tile (3, 1) breaks
    # exactly the tile at (768, 256); tiled on the intact slide, embedded from the damaged copy
    clean = make_slide(name="emb-clean", size_um=640.0, mpp=0.5, seed=0)
    broken = make_slide(name="emb-broken", size_um=640.0, mpp=0.5, seed=0, corrupt_tiles=[(3, 1)])
    params = TileParams(tile_um=128.0, tile_px=256, min_blur_variance=0)
    results = tile_slides(find_slides([clean.path]), out_dir=tmp_path, params=params, threads=1)
    assert [r.status for r in results] == ["ok"]
    h5 = tmp_path / "tiles" / "emb-clean.h5"
    tf = read_tile_file(h5)
    write_tile_file(
        h5, coords=tf.coords, coords_um=tf.coords_um, meta=replace(tf.meta, slide_path=str(broken.path))
    )
    bags = {}
    for decode, readers in (("device", 1), ("cpu", 0)):  # the device run with a reader process
        out = tmp_path / decode
        options = dataclasses.replace(OPTIONS, decode=decode, readers=readers, reader_mode="process")
        results = embed_tiles(tiles_dir=tmp_path, out_dir=out, options=options, progress=False)
        assert results[0].status == "ok", results
        bags[decode] = read_bag(out / BAGS / "emb-clean.h5")
    dev, cpu = bags["device"], bags["cpu"]
    assert dev.meta["n_bad_tiles"] == 1 and len(dev) == len(tf) - 1
    assert (768, 256) not in {tuple(c) for c in dev.coords_px.tolist()}
    np.testing.assert_array_equal(dev.coords_px, cpu.coords_px)
    np.testing.assert_allclose(dev.feats, cpu.feats, rtol=0.02, atol=0.02)


def test_decode_ahead_keeps_order_and_turns_a_decoder_crash_into_a_slide_error(make_slide) -> None:
    slide = make_slide(name="gd-0.5", size_um=(700.0, 560.0), mpp=0.5, seed=1)
    st = _tiles(slide.path, 0.5, [(0, 0), (512, 0), (1024, 512), (0, 512), (512, 512)], 256.0, 256)
    reader = BatchReader([st], batch_size=2)
    batches = [reader[i] for i in range(len(reader))]
    assert all(b.raw is not None and b.tiles.shape == (len(b.ok), 0, 0, 3) for b in batches)
    with DeviceDecoder("cpu") as decoder:
        out = list(decode_ahead(iter(batches), decoder, depth=1, threaded=True))
    assert [b.start for b in out] == [0, 2, 4] and all(b.raw is None and not b.error for b in out)
    got = torch.cat([b.tiles for b in out]).numpy()
    assert _mean_abs(got, _cpu_tiles(st)).max() < MAX_MEAN_ABS

    class Broken(DeviceDecoder):
        def decode(self, raw):  # type: ignore[no-untyped-def]
            raise RuntimeError("CUDA out of memory")

    out = list(decode_ahead(iter(batches), Broken("cpu")))  # inline, as on the CPU
    assert len(out) == 3 and all(
        "device decode failed" in b.error and "out of memory" in b.error for b in out
    )


def test_decode_option_and_cli() -> None:
    assert EmbedOptions().decode == "auto"
    assert resolve_decode("auto", torch.device("cpu")) == "cpu"
    assert resolve_decode("auto", torch.device("cuda")) == "device"
    assert resolve_decode("device", torch.device("cpu")) == "device"
    with pytest.raises(ConfigError, match="--decode"):
        EmbedOptions(decode="gpu")  # type: ignore[arg-type]
    result = CliRunner().invoke(cli, ["embed", "--help"])
    assert result.exit_code == 0 and "--decode" in result.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nvjpeg_tiles_equal_the_cpu_decode(make_slide, shared_data: Path) -> None:
    cases = [(make_slide(name="gd-0.46", size_um=(700.0, 560.0), mpp=0.46, seed=1).path, 0.46)]
    cases.append((shared_data / "slides" / "CMU-1-Small-Region.svs", 0.499))
    for path, mpp in cases:
        st = _tiles(Path(path), mpp, [(0, 0), (600, 400), (1200, 800)], 256.0, 256)
        reader = RawSlideReader.open(st)
        assert reader is not None
        raw = reader.read(0, st.n)
        reader.close()
        with DeviceDecoder("cuda") as gpu, DeviceDecoder("cpu") as cpu:
            on_gpu, ok = gpu.decode(raw)
            on_cpu, _ = cpu.decode(raw)
        assert on_gpu.is_cuda and ok.all()
        assert _mean_abs(on_gpu.cpu().numpy(), on_cpu.numpy()).max() < MAX_MEAN_ABS
        assert _mean_abs(on_gpu.cpu().numpy(), _cpu_tiles(st)).max() < MAX_MEAN_ABS


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_embedding_with_device_decode_matches_cpu_decode(make_slide, tmp_path: Path) -> None:
    slide = make_slide(name="gd-e2e", size_um=640.0, mpp=0.46, seed=0)
    params = TileParams(tile_um=128.0, tile_px=64, min_blur_variance=0)
    tile_slides(find_slides([slide.path]), out_dir=tmp_path, params=params, threads=1)
    bags = {}
    for decode in ("device", "cpu"):
        options = dataclasses.replace(OPTIONS, device="cuda", precision="fp32", decode=decode, readers=1)
        results = embed_tiles(tiles_dir=tmp_path, out_dir=tmp_path / decode, options=options, progress=False)
        assert results[0].status == "ok", results
        bags[decode] = read_bag(tmp_path / decode / BAGS / f"{slide.path.stem}.h5")
    assert bags["device"].meta["n_bad_tiles"] == 0
    np.testing.assert_allclose(bags["device"].feats, bags["cpu"].feats, rtol=0.02, atol=0.02)

"""JPEG batch decoders of the device decoder (device_decode/codecs.py): nvImageCodec gives torchvision's
pixels, its failures are per stream, and the device decoder gives the same tiles with either."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from wsi.pipelines.embed.batches import RawBatch, SlideTiles
from wsi.pipelines.embed.device_decode import DeviceDecoder, RawSlideReader
from wsi.pipelines.embed.device_decode.codecs import CODECS, codec_status, get_codec, torchvision_decode

APERIO = "CMU-1-Small-Region.svs"


def _raw(path: Path, mpp: float, coords: list[tuple[int, int]]) -> RawBatch:
    st = SlideTiles(
        slide_id=path.stem, slide_path=str(path), backend="openslide", mpp=mpp, tile_um=256.0,
        target_mpp=1.0, tile_px=256, coords_px=np.asarray(coords, np.int64), decode="device",
    )  # fmt: skip
    reader = RawSlideReader.open(st)
    assert reader is not None
    try:
        return reader.read(0, st.n)
    finally:
        reader.close()


def _streams(raw: RawBatch) -> list[torch.Tensor]:
    return [raw.stream(j) for j in range(len(raw.lengths)) if raw.lengths[j]]


def test_codec_names_status_and_errors() -> None:
    assert CODECS[0] == "torchvision" and get_codec("torchvision") is torchvision_decode
    status = codec_status()
    assert set(status) == set(CODECS) and status["torchvision"].startswith("ok ")
    with pytest.raises(ValueError, match="choose from torchvision, nvimgcodec"):
        get_codec("dali")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_nvimgcodec_on_the_cpu_gives_torchvisions_pixels(make_slide, shared_data: Path) -> None:
    pytest.importorskip("nvidia.nvimgcodec")
    nvimgcodec = get_codec("nvimgcodec")
    slide = make_slide(name="codec-0.46", size_um=(900.0, 700.0), mpp=0.46, seed=2)
    cases = [_raw(slide.path, 0.46, [(0, 0), (600, 400), (1200, 800)])]  # YCbCr, tables in each tile
    cases.append(_raw(shared_data / "slides" / APERIO, 0.499, [(0, 0), (900, 700), (2000, 1500)]))  # RGB
    cpu = torch.device("cpu")
    for raw in cases:
        streams = _streams(raw)
        want = torchvision_decode(streams, cpu)
        got = nvimgcodec(streams, cpu)
        assert len(got) == len(want) > 0
        for g, w in zip(got, want, strict=True):
            assert g is not None and g.shape == w.shape and g.dtype == torch.uint8
            assert torch.equal(g, w)  # libjpeg-turbo both, fancy upsampling on: the same pixels
    broken = [streams[0], torch.tensor([0xFF, 0xD8, 1, 2, 3], dtype=torch.uint8), streams[1]]
    got = nvimgcodec(broken, cpu)
    assert got[1] is None and got[0] is not None and got[2] is not None  # one stream fails, not the batch


def test_the_device_decoder_gives_the_same_tiles_with_either_codec(make_slide) -> None:
    pytest.importorskip("nvidia.nvimgcodec")
    slide = make_slide(name="codec-0.46", size_um=(900.0, 700.0), mpp=0.46, seed=2)
    raw = _raw(slide.path, 0.46, [(0, 0), (600, 400), (1200, 800), (1900, 1500)])
    tiles = {}
    for codec in CODECS:
        with DeviceDecoder("cpu", codec=codec) as decoder:
            got, ok = decoder.decode(raw)
        assert ok.all()
        tiles[codec] = got.numpy()
    np.testing.assert_array_equal(tiles["torchvision"], tiles["nvimgcodec"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nvimgcodec_on_cuda_matches_the_cpu_decode(make_slide, shared_data: Path) -> None:
    pytest.importorskip("nvidia.nvimgcodec")
    slide = make_slide(name="codec-0.46", size_um=(900.0, 700.0), mpp=0.46, seed=2)
    for raw in (_raw(slide.path, 0.46, [(0, 0), (600, 400)]),
                _raw(shared_data / "slides" / APERIO, 0.499, [(0, 0), (900, 700)])):  # fmt: skip
        with DeviceDecoder("cuda", codec="nvimgcodec") as gpu, DeviceDecoder("cpu") as cpu:
            on_gpu, ok = gpu.decode(raw)
            on_cpu, _ = cpu.decode(raw)
        assert on_gpu.is_cuda and ok.all()
        diff = (on_gpu.cpu().float() - on_cpu.float()).abs().mean(dim=(1, 2, 3))
        assert diff.max() < 3.0, diff

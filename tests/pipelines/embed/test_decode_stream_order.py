"""Device JPEG decode waits for the calling CUDA stream before torchvision's decoder writes its outputs
(`device_decode.decoder.decode_jpegs`): torchvision's CUDA decode lets nvJPEG write from a private
stream not ordered after the caller's (pytorch/vision PR 9606, meta-pytorch/torchcodec PR 1634), so a
recycled block that queued kernels still read gets overwritten. On the CPU the order is checked with a
recording stand-in for the stream; the GPU test is the PR's own scenario and runs with `make gpu-check`."""

from __future__ import annotations

import pytest
import torch
import torchvision.io
from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg

from wsi.pipelines.embed.device_decode.decoder import decode_jpegs

SIDE = 64


def _jpeg(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return encode_jpeg(torch.randint(0, 256, (3, SIDE, SIDE), dtype=torch.uint8, generator=g), quality=90)


def test_on_the_cpu_decode_jpegs_is_torchvisions_decode() -> None:
    streams = [_jpeg(0), _jpeg(1)]
    got = decode_jpegs(streams, torch.device("cpu"))
    want = [decode_jpeg(s, mode=ImageReadMode.RGB) for s in streams]
    assert len(got) == 2 and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert decode_jpegs([], torch.device("cpu")) == []


def test_on_cuda_the_calling_stream_is_waited_for_before_the_decoder_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []

    class Stream:
        def synchronize(self) -> None:
            events.append("wait for the calling stream")

    def current_stream(device: torch.device) -> Stream:
        assert device.type == "cuda"
        return Stream()

    def fake_decode(streams: list[torch.Tensor], **kwargs: object) -> list[torch.Tensor]:
        assert kwargs["device"] == torch.device("cuda")
        events.append("decode")
        return [torch.zeros(3, SIDE, SIDE, dtype=torch.uint8) for _ in streams]

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torchvision.io, "decode_jpeg", fake_decode)
    assert len(decode_jpegs([_jpeg()] * 3, torch.device("cuda"))) == 3
    assert events == ["wait for the calling stream", "decode"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_decode_leaves_memory_that_queued_kernels_still_read_alone() -> None:
    """Tensors the size of a decoded tile are summed by kernels queued behind a long one, freed, and a
    batch is decoded at once: with the wait, every sum sees its own values (16 x 30 checks)."""
    dev = torch.device("cuda")
    n = 3 * SIDE * SIDE // 4  # float32 elements in the bytes of one decoded (3, SIDE, SIDE) uint8 tile
    streams = [_jpeg(k) for k in range(16)]
    wrong = 0
    for _ in range(30):
        xs = [torch.full((n,), float(k + 1), device=dev) for k in range(16)]
        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)  # a long kernel: the sums below stay queued behind it
        sums = [x.sum() for x in xs]
        del xs  # their blocks go back to the allocator while the sums are still queued
        decode_jpegs(streams, dev)
        torch.cuda.synchronize()
        wrong += sum(float(s) != (k + 1) * n for k, s in enumerate(sums))
    assert wrong == 0, f"{wrong} of 480 sums read memory the decoder overwrote"

"""JPEG batch decoders behind one signature, so the device decoder can use a library made for batches.

    decode(streams: list[(n,) uint8 CPU tensors], on: torch.device) -> list[(3, H, W) uint8 on `on` | None]
    (None: that stream did not decode; the device decoder then reads its tiles with the CPU path)

  torchvision   torchvision.io.decode_jpeg: nvJPEG on CUDA (after waiting for the calling stream, see
                decoder.decode_jpegs), libjpeg-turbo on the CPU. One broken stream fails the whole call;
                the device decoder then decodes stream by stream.
  nvimgcodec    NVIDIA nvImageCodec (nvidia-nvimgcodec-cu13, optional): made for batches of images; on
                CUDA nvJPEG's hardware engine (A100, H100, H200) with its CUDA decoders as fallback, on the
                CPU its libjpeg-turbo extension. It returns None for a stream it cannot decode instead of
                failing the batch, allocates outputs itself (not from torch's caching allocator, so the
                block reuse behind torchvision's stream-order bug cannot happen) and orders its work on
                the stream we pass (`cuda_stream`). Fancy upsampling is switched on: nvImageCodec's
                default is off, libjpeg-turbo's (openslide, torchvision) is on, and 4:2:0 tiles would
                differ by a few levels at colour edges otherwise.

Why torchvision stays the default: it is the decoder measured end to end on H100 and H200
(docs/benchmarks.md). nvImageCodec equals it pixel for pixel on the CPU here
(tests/pipelines/embed/test_jpeg_codecs.py);
its GPU speed and pixels are measured by the GPU suite's `decoders` section (benchmarks/jpeg_codecs.py)
and it becomes the default only if that run shows it faster and the same tiles. DALI is left out of the
device decoder: it is a pipeline framework (its wheel is hundreds of MB, more than a lent GPU machine can
be sent) whose image decoder is built on the same nvJPEG; the benchmark measures it where it is installed.
cuCIM replaces the reader of the CPU path, not a JPEG decoder: benchmarks/jpeg_codecs.py measures it too.

Public API:
  CODECS                       names, default first
  codec_status() -> {name: "ok <version>" | why not}
  get_codec(name, device) -> decode function (ImportError when the library is missing)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
import torch

Decode = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor | None]]
CODECS = ("torchvision", "nvimgcodec")


def torchvision_decode(streams: list[torch.Tensor], on: torch.device) -> list[torch.Tensor | None]:
    """RGB images of JPEG `streams`, decoded on `on`, safe for the memory of kernels still queued.

    On CUDA, torchvision allocates the outputs on the calling stream but lets nvJPEG write them from a
    private stream that is not ordered after it (pytorch/vision PR 9606; the hardware engine ignores
    its stream as well, meta-pytorch/torchcodec PR 1634). The caching allocator may hand the decoder a
    block that kernels queued on the calling stream are still reading (the previous batch's gather
    indices), which then read overwritten memory: an "index out of bounds" device-side assert, as in
    the GPU suite. Waiting for the calling stream first closes that window; decoding runs in the
    decode-ahead thread on its own stream, so only that thread waits (for its own previous batch).
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    if not streams:
        return []
    if on.type == "cuda":
        torch.cuda.current_stream(on).synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchvision's "decoding is deprecated" notice
        return list(decode_jpeg(streams, mode=ImageReadMode.RGB, device=on))


@lru_cache(maxsize=8)
def _nvimgcodec_decoder(device_type: str, index: int) -> Any:
    from nvidia import nvimgcodec

    if device_type == "cuda":
        return nvimgcodec.Decoder(device_id=index, options=":fancy_upsampling=1")
    return nvimgcodec.Decoder(
        device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
        backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)],
        options=":fancy_upsampling=1",
    )


def nvimgcodec_decode(streams: list[torch.Tensor], on: torch.device) -> list[torch.Tensor | None]:
    """nvImageCodec's batched decode; outputs (3, H, W) uint8 on `on`, None where a stream failed."""
    from nvidia import nvimgcodec

    if not streams:
        return []
    cuda = on.type == "cuda"
    index = on.index if on.index is not None else (torch.cuda.current_device() if cuda else 0)
    decoder = _nvimgcodec_decoder(on.type, index)
    params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.SRGB)
    data = [s.numpy() for s in streams]  # host views, no copy
    if cuda:
        stream = torch.cuda.current_stream(on)
        images = decoder.decode(data, params=params, cuda_stream=stream.cuda_stream)
        # the images' memory is nvImageCodec's: copy it into torch's on the same stream, and wait for the
        # copies before the images (and their memory) go; this runs in the decode-ahead thread, whose
        # own stream is all that waits
        out = [None if im is None else torch.as_tensor(im, device=on).permute(2, 0, 1).clone()
               for im in images]  # fmt: skip
        stream.synchronize()
        return out
    images = decoder.decode(data, params=params)
    return [None if im is None else torch.from_numpy(np.asarray(im.cpu())).permute(2, 0, 1) for im in images]


def codec_status() -> dict[str, str]:
    """Which codecs this environment has: "ok <version>" or why not."""
    out = {}
    try:
        import torchvision

        out["torchvision"] = f"ok {torchvision.__version__}"
    except ImportError as exc:
        out["torchvision"] = f"not installed ({exc})"
    try:
        from nvidia import nvimgcodec

        out["nvimgcodec"] = f"ok {getattr(nvimgcodec, '__version__', '?')}"
    except ImportError as exc:
        out["nvimgcodec"] = f"not installed (pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg): {exc}"
    return out


def get_codec(name: str) -> Decode:
    """The decode function of `name` (one of CODECS); ImportError when its library is missing."""
    if name == "torchvision":
        return torchvision_decode
    if name == "nvimgcodec":
        from nvidia import nvimgcodec  # noqa: F401  (fail here, not in the first batch)

        return nvimgcodec_decode
    raise ValueError(f"unknown JPEG codec {name!r}; choose from {', '.join(CODECS)}")

"""The encoders of a run on their device, in inference form, and the batch size they share.

Each encoder runs through its own `Encoder.inference_fn` (channels_last for CNNs on CUDA, optional
torch.compile); this module adds what belongs to the stage: autocast precision, CPU threads, cuDNN
autotuning, one padded batch shape on CUDA, and `--batch-size auto` (each encoder's measured memory per
tile on this device; the smallest batch wins, since every encoder sees the same decoded batch).
`prepare_runtimes` gives one `Runtime` per encoder and that batch size; `encode(runtime, tiles)` embeds
(b, P, P, 3) uint8 tiles into (b, D) float32 on the device.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from wsi.models.encoders import Encoder, pick_batch_size
from wsi.pipelines.embed.config import CPU_BATCH, EmbedOptions, Precision

log = logging.getLogger(__name__)

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
AUTO_MAX_BATCH = 256  # "auto" never goes beyond: pinned batches in flight stay a few hundred MB each


def build_encoders(options: EmbedOptions) -> list[Encoder]:
    """Every encoder of the run, built (and so validated: weights, keys, digests) on the CPU."""
    from wsi.models.encoders import build_encoder  # looked up per call: tests count the builds

    built = []
    for c in options.choices():
        enc = build_encoder(
            c.name, weights=c.weights, random_init=options.random_init, expected_sha256=c.expected_sha256,
            input_px=c.input_px,
        )  # fmt: skip
        built.append(enc)
    return built


@dataclass
class Runtime:
    encoder: Encoder
    device: torch.device
    autocast: torch.dtype | None
    fn: Any  # encoder.embed through Encoder.inference_fn, possibly compiled
    pad_to: int | None  # pad short batches to this size (CUDA / compiled: one shape)


def resolve_decode(decode: str, device: torch.device) -> Literal["cpu", "device"]:
    """Where JPEG tiles are decoded: auto means the device when it is a GPU (other files: the CPU)."""
    if decode == "auto":
        return "device" if device.type == "cuda" else "cpu"
    return "device" if decode == "device" else "cpu"


def prepare_runtime(
    encoder: Encoder,
    *,
    device: torch.device,
    precision: Precision = "bf16",
    compile: bool = False,
    threads: int | None = None,
    batch_size: int = 128,
) -> Runtime:
    """The encoder on its device in inference form (its own inference_fn); autocast on CUDA, fp32 on CPU."""
    autocast = _AUTOCAST[precision]
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick its fastest kernels
    else:
        if autocast is not None:
            log.debug("precision %s applies to CUDA; the CPU runs fp32", precision)  # the default: no news
        autocast = None
        if threads:
            torch.set_num_threads(threads)
    fn = encoder.inference_fn(device, compile=compile)
    # One batch shape on CUDA: a slide's short last batch would otherwise make cuDNN re-tune (and a
    # compiled graph re-compile) for every new size; padding costs under half a batch per slide.
    pad_to = batch_size if (compile or device.type == "cuda") else None
    return Runtime(encoder, device, autocast, fn, pad_to)


def prepare_runtimes(
    encoders: Sequence[Encoder], *, device: torch.device, options: EmbedOptions, tile_px: int | None = None
) -> tuple[list[Runtime], int]:
    """Every encoder on `device`, and the batch size of the feed (`options.batch_size`, or "auto").

    All encoders are moved first, so that an "auto" probe sees the memory the others' weights take.
    """
    fixed = options.batch_size if options.batch_size != "auto" else CPU_BATCH
    runtimes = []
    for enc in encoders:
        rt = prepare_runtime(
            enc, device=device, precision=options.precision, compile=options.compile,
            threads=options.threads, batch_size=fixed,
        )  # fmt: skip
        runtimes.append(rt)
    if options.batch_size != "auto" or device.type != "cuda":
        return runtimes, fixed
    batch = min(
        pick_batch_size(rt.encoder, device, tile_px=tile_px, autocast=rt.autocast, max_batch=AUTO_MAX_BATCH)
        for rt in runtimes
    )
    log.info("--batch-size auto: %d tiles per pass on %s", batch, device)
    return [dataclasses.replace(rt, pad_to=batch) for rt in runtimes], batch


@torch.inference_mode()
def encode(rt: Runtime, tiles: torch.Tensor) -> torch.Tensor:
    """(b, P, P, 3) uint8 -> (b, D) float32 features on the runtime's device (no synchronisation)."""
    x = tiles.to(rt.device, non_blocking=True)
    b = x.shape[0]
    if rt.pad_to and b < rt.pad_to:
        x = torch.cat([x, x.new_zeros((rt.pad_to - b, *x.shape[1:]))])  # (pad_to, P, P, 3)
    with torch.autocast(rt.device.type, dtype=rt.autocast or torch.float32, enabled=rt.autocast is not None):
        feats = rt.fn(x)  # (b', D)
    return feats[:b].float()


__all__ = [
    "AUTO_MAX_BATCH", "Runtime", "build_encoders", "encode", "prepare_runtime", "prepare_runtimes",
    "resolve_decode",
]  # fmt: skip

"""The dask side of the embed stage: one encoder per worker, on that worker's own device.

A worker plugin builds the encoder once when the worker starts (not once per slide); each slide job
then borrows it. On a machine with several GPUs, worker k uses GPU k modulo the GPU count.

Public API:
  PLUGIN_NAME
  EncoderPlugin(options)          distributed.WorkerPlugin; .runtime, .lock after setup
  embed_item(item, *, options)    batch function: one slide on the worker's encoder -> JobResult
  EmbedItem(slide_id, path, job)  what run_jobs sends to a worker
"""

from __future__ import annotations

import logging
import threading
import zlib
from dataclasses import dataclass
from typing import Any

import torch
from distributed import WorkerPlugin

from pipelines.devices import resolve_device
from pipelines.embed.engine import Runtime, SlideJob, embed_stream, prepare_runtime
from pipelines.embed.options import EmbedOptions
from pipelines.jobs import JobResult, worker_plugin

log = logging.getLogger(__name__)

PLUGIN_NAME = "wsi-embed-encoder"


@dataclass(frozen=True)
class EmbedItem:
    slide_id: str
    path: str
    job: SlideJob


def worker_device(requested: str | None, worker: Any) -> torch.device:
    """The device for this worker: an explicit index as given, else GPU (worker index mod GPU count)."""
    device = resolve_device(requested)
    if device.type != "cuda" or device.index is not None:
        return device
    name = getattr(worker, "name", 0) if worker is not None else 0
    index = int(name) if str(name).isdigit() else zlib.crc32(str(name).encode())
    return torch.device("cuda", index % torch.cuda.device_count())


class EncoderPlugin(WorkerPlugin):
    """Builds the encoder on the worker's device once; slide jobs share it under a lock."""

    name = PLUGIN_NAME

    def __init__(self, options: EmbedOptions) -> None:
        self._start(options)

    def _start(self, options: EmbedOptions) -> None:
        self.options = options
        self.runtime: Runtime | None = None
        self.lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # sent to workers before setup: only the options travel
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._start(state["options"])

    def setup(self, worker: Any = None) -> None:
        from models.encoders import build_encoder

        o = self.options
        device = worker_device(o.device, worker)
        encoder = build_encoder(
            o.encoder, weights=o.weights, random_init=o.random_init, expected_sha256=o.expected_sha256,
            input_px=o.input_px,
        )  # fmt: skip
        self.runtime = prepare_runtime(
            encoder, device=device, precision=o.precision, compile=o.compile, threads=o.threads,
            batch_size=o.batch_size,
        )  # fmt: skip
        log.info("worker %s: encoder %s on %s", getattr(worker, "name", "inline"), o.encoder, device)

    def teardown(self, worker: Any = None) -> None:
        self.runtime = None


def embed_item(item: EmbedItem, *, options: EmbedOptions) -> JobResult:
    plugin: EncoderPlugin = worker_plugin(PLUGIN_NAME)
    if plugin.runtime is None:
        raise RuntimeError("the encoder plugin was not set up on this worker")
    with plugin.lock:  # one model per device: slides take turns
        # dask workers are daemonic and may not start processes: read with threads
        return embed_stream(
            plugin.runtime,
            [item.job],
            options=options,
            readers=options.readers,
            mode="thread",
            progress=False,
        )[0]

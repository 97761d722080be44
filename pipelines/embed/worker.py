"""The dask side of the embed stage: one encoder per worker, on that worker's own device.

A worker plugin holds one encoder per worker (not one per slide); each slide job borrows it. The
plugin's `setup` only picks the device: dask runs `setup` on the worker's event loop, and building an
encoder (reading hundreds of MB of weights, moving them to a GPU) there stalls the worker's heartbeats
("Event loop was unresponsive for 24 s"). The encoder is built by the first slide job instead, in the
task's own thread, under the plugin's lock. On a machine with several GPUs, worker k uses GPU k modulo
the GPU count.

Public API:
  PLUGIN_NAME
  EncoderPlugin(options)          distributed.WorkerPlugin; .device after setup, .get_runtime() builds the
                                  encoder once (call it holding .lock), .runtime None until then
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
    """One encoder per worker, built by the first slide job (not in `setup`, which runs on the worker's
    event loop); slide jobs share it under a lock."""

    name = PLUGIN_NAME

    def __init__(self, options: EmbedOptions) -> None:
        self._start(options)

    def _start(self, options: EmbedOptions) -> None:
        self.options = options
        self.runtime: Runtime | None = None
        self.device: torch.device | None = None
        self.worker_name = "inline"
        self.lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # sent to workers before setup: only the options travel
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._start(state["options"])

    def setup(self, worker: Any = None) -> None:
        """Pick the device only: fast, because dask calls this on the worker's event loop."""
        self.device = worker_device(self.options.device, worker)
        self.worker_name = str(getattr(worker, "name", "inline"))

    def get_runtime(self) -> Runtime:
        """The worker's encoder on its device, built on the first call (hold `lock` while calling)."""
        if self.runtime is None:
            from models.encoders import build_encoder

            o = self.options
            device = self.device if self.device is not None else worker_device(o.device, None)
            encoder = build_encoder(
                o.encoder, weights=o.weights, random_init=o.random_init, expected_sha256=o.expected_sha256,
                input_px=o.input_px,
            )  # fmt: skip
            self.runtime = prepare_runtime(
                encoder, device=device, precision=o.precision, compile=o.compile, threads=o.threads,
                batch_size=o.batch_size,
            )  # fmt: skip
            log.info("worker %s: encoder %s on %s", self.worker_name, o.encoder, device)
        return self.runtime

    def teardown(self, worker: Any = None) -> None:
        self.runtime = None


def embed_item(item: EmbedItem, *, options: EmbedOptions) -> JobResult:
    plugin: EncoderPlugin = worker_plugin(PLUGIN_NAME)
    with plugin.lock:  # one model per device: slides take turns (and the first one builds it)
        runtime = plugin.get_runtime()
        # dask workers are daemonic and may not start processes: read with threads
        return embed_stream(
            runtime,
            [item.job],
            options=options,
            readers=options.readers,
            mode="thread",
            progress=False,
        )[0]

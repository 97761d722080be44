"""The dask side of the embed stage: the run's encoders once per worker, on that worker's own device.

A worker plugin (`EncoderPlugin`) holds the encoders per worker, not per slide; each slide job
(`embed_item`) borrows them. The plugin's `setup` only picks the device: dask runs `setup` on the
worker's event loop, and building an encoder there (hundreds of MB of weights to a GPU) stalls the
worker's heartbeats ("Event loop was unresponsive for 24 s"). The first slide job builds them instead,
in the task's own thread, under the plugin's lock. Which GPU a worker takes: gpus.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import torch
from distributed import WorkerPlugin

from wsi.models.encoders.stain import StainReference
from wsi.pipelines.embed.config import EmbedOptions
from wsi.pipelines.embed.engine import Runtime, embed_works
from wsi.pipelines.embed.gpus import worker_gpu
from wsi.pipelines.embed.runtime import build_encoders, prepare_runtimes
from wsi.pipelines.embed.work import SlideWork, WorkResult
from wsi.pipelines.scheduling.devices import resolve_device
from wsi.pipelines.scheduling.jobs import worker_plugin
from wsi.pipelines.scheduling.results import JobResult

log = logging.getLogger(__name__)

PLUGIN_NAME = "wsi-embed-encoder"


@dataclass(frozen=True)
class EmbedItem:
    slide_id: str
    path: str
    work: SlideWork


def worker_device(requested: str | None, worker: Any, devices: Sequence[str] | None = None) -> torch.device:
    """The device of this worker: `devices` by worker number (--gpus), an explicit index as given, else a
    GPU by worker number (gpus.worker_gpu), else the CPU."""
    name = getattr(worker, "name", 0) if worker is not None else 0
    if devices:
        return worker_gpu(name, devices, len(devices))
    device = resolve_device(requested)
    if device.type != "cuda" or device.index is not None:
        return device
    return worker_gpu(name, None, torch.cuda.device_count())


class _Settings(TypedDict):
    """What an EncoderPlugin sends to a worker (its encoders are built there)."""

    options: EmbedOptions
    stain: StainReference | None
    devices: tuple[str, ...]


class EncoderPlugin(WorkerPlugin):
    """The run's encoders once per worker, built by the first slide job (not in `setup`, which runs on the
    worker's event loop); slide jobs share them under a lock."""

    name = PLUGIN_NAME

    def __init__(
        self,
        options: EmbedOptions,
        *,
        stain: StainReference | None = None,
        devices: Sequence[str] | None = None,
    ) -> None:
        self._start(options, stain, tuple(devices or ()))

    def _start(self, options: EmbedOptions, stain: StainReference | None, devices: tuple[str, ...]) -> None:
        self.options = options
        self.stain = stain
        self.devices = devices
        self.runtimes: list[Runtime] | None = None
        self.batch_size = 0
        self.device: torch.device | None = None
        self.worker_name = "inline"
        self.lock = threading.Lock()

    def __getstate__(self) -> _Settings:  # sent to workers before setup: only the settings travel
        return {"options": self.options, "stain": self.stain, "devices": self.devices}

    def __setstate__(self, state: _Settings) -> None:
        self._start(state["options"], state["stain"], tuple(state["devices"]))

    @property
    def runtime(self) -> Runtime | None:
        """The first encoder's runtime (None until built)."""
        return self.runtimes[0] if self.runtimes else None

    def setup(self, worker: Any = None) -> None:
        """Pick the device only: fast, because dask calls this on the worker's event loop."""
        self.device = worker_device(self.options.device, worker, self.devices)
        self.worker_name = str(getattr(worker, "name", "inline"))

    def get_runtimes(self) -> list[Runtime]:
        """The worker's encoders on its device, built on the first call (hold `lock` while calling)."""
        if self.runtimes is None:
            o = self.options
            device = self.device if self.device is not None else worker_device(o.device, None, self.devices)
            encoders = build_encoders(o)
            self.runtimes, self.batch_size = prepare_runtimes(encoders, device=device, options=o)
            names = ", ".join(c.name for c in o.choices())
            log.info("worker %s: encoder%s %s on %s", self.worker_name, "s" * (len(encoders) > 1), names,
                     device)  # fmt: skip
        return self.runtimes

    def get_runtime(self) -> Runtime:
        """The first encoder's runtime, built with the others on the first call (hold `lock`)."""
        return self.get_runtimes()[0]

    def teardown(self, worker: Any = None) -> None:
        self.runtimes = None


def embed_item(item: EmbedItem, *, options: EmbedOptions) -> JobResult:
    """One slide, read once, through every encoder its work names; one JobResult per bag in `.bags`."""
    plugin: EncoderPlugin = worker_plugin(PLUGIN_NAME)
    with plugin.lock:  # one set of models per device: slides take turns (and the first one builds them)
        runtimes = plugin.get_runtimes()
        # dask workers are daemonic and may not start processes: read with threads
        [bags] = embed_works(
            runtimes, [item.work], options=options, readers=options.readers, mode="thread", progress=False,
            stain=plugin.stain, batch_size=plugin.batch_size or None,
        )  # fmt: skip
    done = [b for b in bags if b is not None]
    worst = next((b for b in done if b.status == "failed"), None) or done[0]
    n, seconds = sum(b.n for b in done), max(b.seconds for b in done)
    return WorkResult(item.slide_id, item.path, worst.status, n=n, seconds=seconds, error=worst.error,
                      bags=tuple(bags))  # fmt: skip

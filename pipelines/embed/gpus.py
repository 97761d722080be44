"""One embed worker per GPU: which GPUs `--gpus` means, and which one a dask worker takes.

Locally, `--gpus N` starts a dask LocalCluster of N worker processes (named 0..N-1 by dask); worker k
holds its encoders on `cuda:k` (the explicit device index travels in the worker plugin). On a cluster
of your own (`--scheduler`), start one worker per GPU pinned with CUDA_VISIBLE_DEVICES, so that each sees
one GPU as cuda:0:
    CUDA_VISIBLE_DEVICES=0 dask worker tcp://host:8786 --nworkers 1 --nthreads 1 &
    CUDA_VISIBLE_DEVICES=1 dask worker tcp://host:8786 --nworkers 1 --nthreads 1 &
A worker that sees several GPUs and has no number for a name gets one by a hash of its name, which may
put two workers on one GPU: it says so in the log.

Public API:
  assign_gpus(gpus, available) -> list[torch.device]      cuda:0..N-1; ConfigError without enough GPUs
  worker_gpu(worker_name, devices, visible) -> torch.device    the device of one worker
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Sequence

import torch

from wsi.core.errors import ConfigError
from wsi.pipelines.embed.config import Gpus

log = logging.getLogger(__name__)

def assign_gpus(gpus: Gpus, available: int) -> list[torch.device]:
    """The devices of a `--gpus` run: cuda:0 .. cuda:N-1 of the `available` GPUs torch sees here."""
    if available < 1:
        raise ConfigError(
            f"--gpus {gpus}: no CUDA GPU is visible here (torch.cuda.device_count() is 0); run without "
            "--gpus to use the CPU, or check the driver and CUDA_VISIBLE_DEVICES"
        )
    n = available if gpus == "all" else gpus
    if n > available:
        raise ConfigError(
            f"--gpus {n}: only {available} CUDA GPU{'s' if available > 1 else ''} visible here; give "
            f"--gpus {available} or --gpus all"
        )
    return [torch.device("cuda", i) for i in range(n)]


def worker_gpu(worker_name: object, devices: Sequence[str] | None, visible: int) -> torch.device:
    """The GPU of the dask worker called `worker_name`.

    devices: the explicit list of a `--gpus` LocalCluster (worker k -> devices[k]). Without it (a cluster
    of your own): the only GPU when the worker sees one (pinned by CUDA_VISIBLE_DEVICES), else GPU
    (worker number mod `visible`).
    """
    name = str(worker_name)
    index = int(name) if name.isdigit() else zlib.crc32(name.encode())
    if devices:
        return torch.device(devices[index % len(devices)])
    if visible <= 1:
        return torch.device("cuda", 0)
    if not name.isdigit():
        log.warning(
            "dask worker %s sees %d GPUs and has no number for a name; it takes cuda:%d by a hash of its "
            "name, and two workers may share a GPU: start one worker per GPU with CUDA_VISIBLE_DEVICES=k "
            "(CUDA_VISIBLE_DEVICES is %r here)",
            name, visible, index % visible, os.environ.get("CUDA_VISIBLE_DEVICES"),
        )  # fmt: skip
    return torch.device("cuda", index % visible)


__all__ = ["assign_gpus", "worker_gpu"]

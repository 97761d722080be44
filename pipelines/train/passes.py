"""Passes of a model over a loader without gradients (validation, test, prediction of a run's
splits), and the figures every pass reports (peak memory). One host synchronisation per pass."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from wsi.pipelines.inputs import Batch
from wsi.pipelines.scheduling.devices import autocast_for
from wsi.pipelines.study.kinds import TaskKind
from wsi.pipelines.train.finite import check_outputs


def forward_batch(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The model's logits (B, C) on a batch already on its device (float16 features cast up)."""
    return model(batch.x.float() if batch.x.dtype == torch.float16 else batch.x, **batch.model_inputs())


@dataclass
class Predicted:
    """A model's outputs on a loader, in loader order (host arrays)."""

    ids: list[str]
    labels: np.ndarray  # (n,) int64 batch labels (categorical: the class)
    targets: np.ndarray  # (n, T) float target vectors
    logits: np.ndarray  # (n, C) float32
    outputs: np.ndarray  # (n, K) the kind's outputs (probabilities, values, risk)


@torch.inference_mode()
def predict_loader(
    model: torch.nn.Module, loader: DataLoader[Any], *, device: torch.device, kind: TaskKind
) -> Predicted:
    """Every case of `loader` through the model; one host sync at the end."""
    model.eval()
    autocast = autocast_for(device)
    ids: list[str] = []
    labels: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    logits_all: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    for batch in loader:
        if batch.x.shape[0] == 0:
            continue
        batch = batch.to(device)
        with autocast():
            logits = forward_batch(model, batch)
        outputs.append(kind.outputs(logits))
        logits_all.append(logits.float())
        labels.append(batch.labels)
        if batch.targets is not None:
            targets.append(batch.targets)
        ids.extend(batch.ids)
    n_t, n_o = len(kind.target_names), kind.num_outputs
    if not ids:
        no_logits = np.zeros((0, n_o), dtype=np.float32)
        return Predicted([], np.zeros(0, dtype=np.int64), np.zeros((0, n_t)), no_logits, no_logits.copy())
    out = torch.cat(outputs).cpu().numpy()
    check_outputs(ids, out)  # no figure and no class from a NaN output
    return Predicted(
        ids=ids,
        labels=torch.cat(labels).cpu().numpy(),
        targets=torch.cat(targets).cpu().numpy().astype(np.float64) if targets else np.zeros((len(ids), n_t)),
        logits=torch.cat(logits_all).cpu().numpy(),
        outputs=out,
    )


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**20
    # CPU: the process's peak resident set (KiB on Linux, bytes on macOS); not reset per epoch
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


__all__ = ["Predicted", "forward_batch", "peak_mem_mb", "predict_loader"]

"""Stopping a run whose loss or gradient stops being finite, naming the bags of that step.

Features are checked before training (`pipelines.train.preflight`), so a NaN here means the model
itself diverged (a learning rate too high, an overflow) or an input too extreme to learn from. Going on
would make every weight NaN and report metrics computed from NaN outputs; stopping with the step's ids
tells the user where to look.

On a CUDA device reading a flag is a host synchronisation, which the loop otherwise avoids per step:
the flags stay on the device and are read every `CUDA_CHECK_EVERY` steps and at the end of the epoch (a
NaN is still caught, a few steps late). On the CPU they are read at once, before the optimizer steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from wsi.core.errors import WsiError

#: optimizer steps between two reads of the flags on an accelerator
CUDA_CHECK_EVERY = 32


class NonFiniteTrainingError(WsiError):
    """The loss, a gradient or a model output is NaN or infinite; the message names the inputs."""


def _listed(ids: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


_ADVICE = (
    "check these inputs (bags were checked for NaN features before training, so with bags the model "
    "itself diverged): lower optimizer.lr or set optimizer.grad_clip (e.g. 1.0)"
)


class FiniteWatch:
    """Non-finite flags of one epoch's losses and gradient norms, with the ids each one covers."""

    def __init__(self, device: torch.device, *, epoch_desc: str = "") -> None:
        self.eager = device.type == "cpu"  # reading a CPU tensor costs no synchronisation
        self.where = epoch_desc
        self.flags: list[torch.Tensor] = []  # () bool each, True = not finite
        self.labels: list[tuple[str, list[str]]] = []  # (what, ids) of each flag
        self.pending_ids: list[str] = []  # ids since the last optimizer step (a gradient covers them all)
        self.steps = 0

    def loss(self, loss: torch.Tensor, ids: Sequence[str]) -> None:
        """Flag one loss (computed over the bags `ids`)."""
        self.flags.append(~torch.isfinite(loss.detach()))
        self.labels.append(("loss", list(ids)))
        self.pending_ids.extend(ids)

    def gradient(self, norm: torch.Tensor) -> None:
        """Flag the total gradient norm of the coming optimizer step (over the bags since the last one),
        then check (on the CPU now; on an accelerator every `CUDA_CHECK_EVERY` steps)."""
        self.flags.append(~torch.isfinite(norm.detach()))
        self.labels.append(("gradient", self.pending_ids))
        self.pending_ids = []
        self.steps += 1
        if self.eager or self.steps % CUDA_CHECK_EVERY == 0:
            self.check()

    def check(self) -> None:
        """Raise NonFiniteTrainingError for the first flagged loss or gradient; forget the flags read."""
        if not self.flags:
            return
        bad = torch.stack(self.flags).nonzero().flatten().cpu().numpy()
        labels = self.labels
        self.flags, self.labels = [], []
        if not len(bad):
            return
        what, ids = labels[int(bad[0])]
        where = f" in {self.where}" if self.where else ""
        subject = "the loss" if what == "loss" else "the gradient"
        raise NonFiniteTrainingError(
            f"training stopped{where}: {subject} is NaN or infinite on bag(s) {_listed(ids)}; {_ADVICE}"
        )


def check_outputs(ids: Sequence[str], outputs: np.ndarray, what: str = "") -> None:
    """Raise NonFiniteTrainingError naming the cases whose outputs (n, K) are not finite: no figure and
    no class is ever taken from a NaN probability."""
    bad = ~np.isfinite(outputs).reshape(len(ids), -1).all(axis=1) if len(ids) else np.zeros(0, bool)
    if bad.any():
        names = [cid for cid, b in zip(ids, bad, strict=True) if b]
        raise NonFiniteTrainingError(
            f"the model's outputs are NaN or infinite on {f'{what} ' if what else ''}case(s) "
            f"{_listed(names)}; {_ADVICE}"
        )


__all__ = ["CUDA_CHECK_EVERY", "FiniteWatch", "NonFiniteTrainingError", "check_outputs"]

"""Model kinds' own training objectives: where an author's training quirk lives, not in the loop.

CLAM adds an instance-clustering loss on its most and least attended tiles, DSMIL trains its
max-instance stream beside its bag stream, DTFD-MIL trains a first tier on pseudo-bags and a second
tier on what the first distils. Each is part of the model kind, so the generic training loop
(`pipelines.train.loop`) knows none of them. It asks `training_step(model, x, **inputs)`:

- a model with a `training_step` method returns a `TrainingStep(logits, objective)`: the bag logits the
  task kind scores, and `objective(LossInputs)` -> the scalar loss to minimise (it calls
  `LossInputs.task_loss` on whichever logits the authors' loss puts through the task's loss);
- any other model returns its forward's logits and no objective: the task's loss of the logits.

After the backward pass and before the loop's own clipping, `before_optimizer_step(model)` calls a
model's `before_optimizer_step()` when it has one (DTFD-MIL clips each of its tiers' modules to the
authors' norm, as its two optimizers did).

A model whose objective needs a class per bag (all three above) trains categorical tasks only; it says
so in `task_kinds` (models.model_kinds) and `wsi train` refuses other task kinds by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class LossInputs:
    """What an objective gets from the task: its loss, the bags' classes and its class weights."""

    task_loss: Callable[[Tensor], Tensor]  # the task kind's loss of (B, C) logits of this batch's bags
    labels: Tensor  # (B,) int64 class of each bag (categorical tasks)
    class_weights: Tensor | None = None  # (C,) when the task balances its classes, else None


Objective = Callable[[LossInputs], Tensor]


@dataclass
class TrainingStep:
    """One training forward: the bag logits (B, C) and, for models with their own loss, the objective."""

    logits: Tensor
    objective: Objective | None = None


def training_step(model: nn.Module, x: Tensor, **inputs: Any) -> TrainingStep:
    """The model's training forward: its own `training_step`, else its forward with no objective."""
    own = getattr(model, "training_step", None)
    if callable(own):
        step = own(x, **inputs)
        if not isinstance(step, TrainingStep):
            raise TypeError(f"{type(model).__name__}.training_step must return a TrainingStep")
        return step
    return TrainingStep(model(x, **inputs))


def before_optimizer_step(model: nn.Module) -> None:
    """Run the model's own gradient handling (after backward, before the optimizer step), if any."""
    hook = getattr(model, "before_optimizer_step", None)
    if callable(hook):
        hook()


def sigmoid_targets(labels: Tensor, outputs: int) -> Tensor:
    """The per-output BCE targets (B, outputs) of class indices (B,) under DSMIL's authors' convention
    (binli123/dsmil-wsi train_tcga.py get_bag_feats): one output for two classes holds the class index
    (the first class, the negative one, is an all-zero target); more outputs are one-hot."""
    if outputs == 1:
        return labels[:, None].to(torch.float32)
    return torch.nn.functional.one_hot(labels, outputs).to(torch.float32)


def weighted_mean(losses: Tensor, labels: Tensor, class_weights: Tensor | None) -> Tensor:
    """Per-bag losses (B,) -> their mean, weighted by each bag's class weight as cross-entropy weighs
    (sum w_y l / sum w_y) when the task gives class weights."""
    if class_weights is None:
        return losses.mean()
    w = class_weights.to(losses.dtype)[labels]
    return (w * losses).sum() / w.sum().clamp_min(torch.finfo(losses.dtype).tiny)


__all__ = [
    "LossInputs",
    "Objective",
    "TrainingStep",
    "before_optimizer_step",
    "sigmoid_targets",
    "training_step",
    "weighted_mean",
]

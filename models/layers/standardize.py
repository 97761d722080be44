"""Per-feature standardisation of a model's input, held in the model so that it is stored with it.

A task with `standardize_features: true` z-scores every input feature with the mean and sd of its
training split's tiles (fitted by `pipelines.train.feature_stats`). The transform is a submodule of the
model (`input_standardizer`, float32 buffers `mean` and `scale`), applied by each bag model's first
step (`_embed` of the MIL transformer and ABMIL, `_rows` of the slide-embedding heads). Hence:

- it lives in best.safetensors (and last.safetensors, the resume state, averaged weights): the run
  folder cannot lose it or pair it with another fold's weights;
- every path into the model applies it identically: training, validation, test, `wsi predict` from
  bags, from raw slides and streamed chunk by chunk, contributions and leave-one-out re-forwards;
- it is computed in float32 before the first layer casts (bf16 autocast on CUDA then sees z-scores of
  order 1, not raw values whose spread is lost in bf16's 8-bit mantissa).

Why not fold it into the first linear layer (W / s, b - W m / s)? The heads put a LayerNorm first, which
no per-feature affine map commutes with; a feature whose mean is many sds from 0 would lose its spread
to cancellation in the folded bias (worse in bf16); and training-time feature dropout must drop a
feature to its mean, which needs the mean at hand. A model without the submodule (every run written
before it existed) computes exactly what it always did.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

#: the submodule's name; its buffers appear in state dicts as `input_standardizer.mean` / `.scale`
STANDARDIZER = "input_standardizer"
MEAN_KEY = f"{STANDARDIZER}.mean"
SCALE_KEY = f"{STANDARDIZER}.scale"


class FeatureStandardizer(nn.Module):
    """x -> (x - mean) / scale per feature, in float32 (scale 1 where a feature did not vary)."""

    mean: Tensor
    scale: Tensor

    def __init__(self, mean: Tensor, scale: Tensor) -> None:
        super().__init__()
        if mean.ndim != 1 or mean.shape != scale.shape:
            shapes = f"{tuple(mean.shape)}, {tuple(scale.shape)}"
            raise ValueError(f"mean and scale must be (D,) alike, got {shapes}")
        if not bool(torch.isfinite(mean).all() & torch.isfinite(scale).all() & (scale > 0).all()):
            raise ValueError("feature standardisation needs finite means and positive finite scales")
        self.register_buffer("mean", mean.detach().to(torch.float32).clone())
        self.register_buffer("scale", scale.detach().to(torch.float32).clone())

    def forward(self, x: Tensor) -> Tensor:
        return (x.float() - self.mean.float()) / self.scale.float()

    def extra_repr(self) -> str:
        return f"features={self.mean.numel()}"


def attach_standardizer(model: nn.Module, mean: Tensor, scale: Tensor) -> FeatureStandardizer:
    """Give `model` an input standardisation (replacing one it had); returns it."""
    module = FeatureStandardizer(mean, scale)
    first = next(iter(model.parameters()), None)
    if first is not None:
        module.to(first.device)
    model.add_module(STANDARDIZER, module)
    return module


def input_standardizer(model: nn.Module) -> FeatureStandardizer | None:
    """The model's input standardisation, or None when it has none."""
    module = model._modules.get(STANDARDIZER)
    return module if isinstance(module, FeatureStandardizer) else None


def standardize_input(model: nn.Module, x: Tensor) -> Tensor:
    """`x` standardised by the model's own standardisation (float32), or `x` as it is without one."""
    module = input_standardizer(model)
    return x if module is None else module(x)


def ensure_for_state(model: nn.Module, state: dict[str, Tensor]) -> bool:
    """Before loading `state` into `model`: a state holding a standardisation gets a placeholder of its
    width to load into (its values come from the state). Returns whether the state holds one."""
    if MEAN_KEY not in state:
        return False
    if input_standardizer(model) is None:
        width = state[MEAN_KEY].shape
        attach_standardizer(model, torch.zeros(width), torch.ones(width))
    return True


__all__ = [
    "MEAN_KEY",
    "SCALE_KEY",
    "STANDARDIZER",
    "FeatureStandardizer",
    "attach_standardizer",
    "ensure_for_state",
    "input_standardizer",
    "standardize_input",
]

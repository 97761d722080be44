"""Heads on slide (or patient) embeddings: presets `linear` (a linear probe) and `mlp` (one hidden layer).

Slide foundation models are compared by fitting a small head on their frozen embeddings (TITAN,
PRISM, FEATHER and CHIEF papers all report linear probes). Each sample is a (B, N, D) stack of N
embeddings with the bags' mask (N = 1 for a slide; a patient case holds one row per slide, and the
rows are averaged: late fusion), so these heads train, cross-validate and predict through the same
loop, run record and report as the MIL models, for every task kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from wsi.core.config import config_dict, config_model
from wsi.core.json_types import JsonObject
from wsi.models.base.kinds import MODEL_KINDS, KindModel
from wsi.models.layers.standardize import standardize_input
from wsi.models.layers.transformer import MAX_MODEL_INT

_Width = Annotated[int, Field(gt=0, le=MAX_MODEL_INT, strict=True)]
_Rate = Annotated[float, Field(ge=0.0, lt=1.0)]


def _mean_rows(x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """(mean over real rows (B, D), weights (B, N) summing to one per sample)."""
    if mask is None:
        w = torch.full(x.shape[:2], 1.0 / x.shape[1], dtype=x.dtype, device=x.device)
    else:
        m = mask.to(x.dtype)
        w = m / m.sum(1, keepdim=True).clamp_min(1.0)
    return (x * w[..., None]).sum(1), w


@config_model
@dataclass(frozen=True)
class LinearHeadConfig:
    kind: Literal["linear"] = "linear"
    in_dim: _Width = 768  # embedding width (FEATHER 512, CHIEF 768)
    num_classes: _Width = 2
    dropout: _Rate = 0.0  # on the embedding, training only
    norm: bool = True  # LayerNorm (no affine) first: embeddings of different encoders differ in scale

    def to_dict(self) -> JsonObject:
        return config_dict(self)


@config_model
@dataclass(frozen=True)
class MLPHeadConfig:
    kind: Literal["mlp"] = "mlp"
    in_dim: _Width = 768
    hidden_dim: _Width = 256
    num_classes: _Width = 2
    dropout: _Rate = 0.25  # on the embedding and the hidden layer, training only
    norm: bool = True

    def to_dict(self) -> JsonObject:
        return config_dict(self)


class _Head(KindModel):
    norm: nn.Module
    body: nn.Module
    out: nn.Linear

    def _rows(self, x: Tensor) -> Tensor:
        x = standardize_input(self, x).to(self.out.weight.dtype)  # z-scores when the task asked
        return self.norm(x)

    def forward(self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None) -> Tensor:
        """x (B, N, in_dim) embeddings, mask (B, N) True = real -> logits (B, C); coords are ignored."""
        z, _ = _mean_rows(self._rows(x), mask)
        return self.out(self.body(z))

    def tile_contributions(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """Each row's share of the logits (B, N, C), 0 at padding: the row's weight times the head on that
        row alone, minus the bias. Exact for `linear`; for `mlp` exact with one row (a slide)."""
        rows = self._rows(x)
        _, w = _mean_rows(rows, mask)
        per_row = self.out(self.body(rows)) - self.out.bias  # (B, N, C)
        return per_row * w[..., None]


@MODEL_KINDS.register("linear")
class LinearHead(_Head):
    config_class = LinearHeadConfig
    config: LinearHeadConfig

    def __init__(self, config: LinearHeadConfig) -> None:
        super().__init__()
        self.config = config
        self.norm = nn.LayerNorm(config.in_dim, elementwise_affine=False) if config.norm else nn.Identity()
        self.body = nn.Dropout(config.dropout)
        self.out = nn.Linear(config.in_dim, config.num_classes)


@MODEL_KINDS.register("mlp")
class MLPHead(_Head):
    config_class = MLPHeadConfig
    config: MLPHeadConfig

    def __init__(self, config: MLPHeadConfig) -> None:
        super().__init__()
        self.config = config
        self.norm = nn.LayerNorm(config.in_dim, elementwise_affine=False) if config.norm else nn.Identity()
        self.body = nn.Sequential(
            nn.Dropout(config.dropout), nn.Linear(config.in_dim, config.hidden_dim), nn.GELU(),
            nn.Dropout(config.dropout),
        )  # fmt: skip
        self.out = nn.Linear(config.hidden_dim, config.num_classes)

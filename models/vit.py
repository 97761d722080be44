"""ViT2D (preset `vit-2d`) and ViT3D (preset `vit-3d`): class-token vision transformers for images.

Patches are embedded by a strided convolution; a fixed sine-cosine encoding computed from the patch
grid makes any input size (divisible by the patch size) work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from wsi.core.config import config_model
from wsi.core.errors import ConfigError
from wsi.models.attention.layout import grid_neighbours
from wsi.models.base.kinds import MODEL_KINDS, KindModel
from wsi.models.layers.posenc import sincos_grid
from wsi.models.layers.transformer import PositiveInt, Transformer, TransformerConfig, decompose_cls_logits


@config_model
@dataclass
class ViTConfig(TransformerConfig):
    kind: Literal["vit2d", "vit3d"] = "vit2d"  # model class: 2D images or 3D volumes
    in_channels: PositiveInt = 3  # image channels (1 grey, 3 RGB)
    # (depth,) height, width of a patch in pixels; one int means the same along every axis
    patch_size: PositiveInt | list[PositiveInt] = field(default_factory=lambda: [16, 16])
    dim: PositiveInt = 1024  # token width D' (paper, Table 1)
    depth: PositiveInt = 8  # transformer blocks (paper, Table 1)
    mlp_dim: PositiveInt = 1024  # MLP hidden width (paper, Table 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        ndim = 2 if self.kind == "vit2d" else 3
        p = [self.patch_size] * ndim if isinstance(self.patch_size, int) else list(self.patch_size)
        if len(p) != ndim:
            raise ConfigError(f"{self.kind} patch_size needs {ndim} positive sizes, got {self.patch_size!r}")
        self.patch_size = p

    def patch_shape(self) -> tuple[int, ...]:
        """The patch size as one int per spatial axis."""
        p = self.patch_size
        return tuple([p] if isinstance(p, int) else p)


class _ViT(KindModel):
    inputs: ClassVar[tuple[str, ...] | None] = ("images",)
    config_class = ViTConfig
    config: ViTConfig
    no_weight_decay = frozenset({"cls_token"})  # parameters AdamW must not decay (models.param_groups)
    ndim = 2

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        patch = config.patch_shape()
        conv = nn.Conv2d if self.ndim == 2 else nn.Conv3d
        self.patch_embed = conv(config.in_channels, config.dim, patch, stride=patch)  # type: ignore[arg-type]
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        block_options = config.block_options()
        if config.attention == "gdla":
            block_options["attention_options"].setdefault("grid_ndim", self.ndim)
        self.transformer = Transformer(
            config.depth, config.dim, config.heads, config.mlp_dim, **block_options
        )
        self.norm = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.num_classes)

    def grid_shape(self, image_shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
        """Patch grid of an input whose spatial shape is (H, W) or (D, H, W) (or a full (B, C, ...))."""
        spatial = tuple(int(s) for s in image_shape)[-self.ndim :]
        if len(spatial) != self.ndim or any(
            s % p for s, p in zip(spatial, self.config.patch_shape(), strict=True)
        ):
            raise ConfigError(
                f"{self.config.kind} input of spatial shape {spatial} must be divisible by the patch size "
                f"{self.config.patch_shape()}; crop or pad the image"
            )
        return tuple(s // p for s, p in zip(spatial, self.config.patch_shape(), strict=True))

    def _tokens(self, images: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        if images.ndim != self.ndim + 2 or images.shape[1] != self.config.in_channels:
            raise ConfigError(
                f"{self.config.kind} expects (B, {self.config.in_channels}, "
                f"{'D, ' if self.ndim == 3 else ''}H, W) images, got {tuple(images.shape)}"
            )
        grid = self.grid_shape(images.shape)
        patches = self.patch_embed(images.to(self.patch_embed.weight.dtype)).flatten(2).transpose(1, 2)
        patches = patches + sincos_grid(grid, self.config.dim, images.device).to(patches.dtype)  # (B, P, dim)
        cls = self.cls_token.expand(images.shape[0], -1, -1).to(patches.dtype)
        return torch.cat([cls, patches], dim=1), grid  # (B, 1 + P, dim)

    def _neighbours(self, tokens: Tensor, grid: tuple[int, ...]) -> Tensor | None:
        """The patch grid's neighbour table (1, 1 + P, T) behind the class token, if a block mixes it."""
        if not self.transformer.needs_neighbours:
            return None
        return grid_neighbours(grid, tokens.shape[1], tokens.device)

    def forward(self, images: Tensor, *, max_tokens_per_chunk: int | None = None) -> Tensor:
        """(B, C, H, W) or (B, C, D, H, W) -> logits (B, num_classes)."""
        tokens, grid = self._tokens(images)
        neighbours = self._neighbours(tokens, grid)
        chunk = self.config.chunk_for(tokens.shape[1], max_tokens_per_chunk)
        if chunk and not torch.is_grad_enabled():  # row-major patches: already in raster order
            h = self.transformer.forward_chunked_(tokens, None, chunk, neighbours)
        else:
            ckpt = self.config.checkpoint_for(tokens.shape[1], self.training)
            h = self.transformer(tokens, None, neighbours, checkpointing=ckpt)
        return self.head(self.norm(h[:, 0]))

    def logit_decomposition(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """(contrib (B, P, C), base (B, C)) with logits == base + contrib.sum(1)."""
        tokens, grid = self._tokens(images)
        blocks = self.transformer.layers()
        neighbours = self._neighbours(tokens, grid)
        contrib, base = decompose_cls_logits(blocks, self.norm, self.head, tokens, None, neighbours)
        return contrib[:, 1:], base

    def tile_contributions(self, images: Tensor) -> Tensor:
        """Each patch's additive share of each logit, (B, P, C); reshape P to `grid_shape(images.shape)`."""
        return self.logit_decomposition(images)[0]

    def num_patches(self, image_shape: tuple[int, ...]) -> int:
        return math.prod(self.grid_shape(image_shape))


@MODEL_KINDS.register("vit2d")
class ViT2D(_ViT):
    ndim = 2


@MODEL_KINDS.register("vit3d")
class ViT3D(_ViT):
    ndim = 3

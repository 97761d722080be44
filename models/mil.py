"""MILTransformer (preset `vit-wsi`): a class-token transformer over a bag of tile features.

Tiles are unordered: without position encoding the model is invariant to their order. With
`pos_encoding` on, a fixed 2D sine-cosine encoding of the tile coordinates (micrometres, so it means the
same at any magnification) is added to each projected feature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from models.kinds import MODEL_KINDS, KindModel
from models.posenc import sincos_from_coords_um
from models.transformer import PositiveInt, Transformer, TransformerConfig, chunk_slices, decompose_cls_logits
from wsi.config import config_model
from wsi.errors import ConfigError


@config_model
@dataclass
class MILConfig(TransformerConfig):
    kind: Literal["mil"] = "mil"  # model class (models.kinds)
    in_dim: PositiveInt = 2048  # bag feature width (RetCCL: 2048)
    pos_encoding: bool = False  # add sincos(coords_um / pos_unit_um); off: order-invariant
    pos_unit_um: Annotated[float, Field(gt=0)] = 256.0  # micrometres per encoding unit (about one tile)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.attention_options.get("local"):
            raise ConfigError(
                "attention_options local=True needs a token grid, which a MIL bag does not have "
                "(the local branch would never run); remove it"
            )


@MODEL_KINDS.register("mil")
class MILTransformer(KindModel):
    config_class = MILConfig
    config: MILConfig

    def __init__(self, config: MILConfig) -> None:
        super().__init__()
        self.config = config
        self.proj = nn.Linear(config.in_dim, config.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.transformer = Transformer(
            config.depth, config.dim, config.heads, config.mlp_dim, **config.block_options()
        )
        self.norm = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.num_classes)

    # --- inputs --------------------------------------------------------------------------------------
    def _check(self, x: Tensor, mask: Tensor | None, coords_um: Tensor | None) -> None:
        if x.ndim != 3 or x.shape[-1] != self.config.in_dim:
            raise ConfigError(
                f"bag features must be (B, N, {self.config.in_dim}), got {tuple(x.shape)}; "
                "set in_dim to the encoder's feature width"
            )
        if mask is not None and (mask.dtype != torch.bool or mask.shape != x.shape[:2]):
            raise ConfigError(
                f"mask must be bool {tuple(x.shape[:2])} (True = real tile), "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )
        if self.config.pos_encoding and (coords_um is None or coords_um.shape != (*x.shape[:2], 2)):
            raise ConfigError(f"pos_encoding is on: pass coords_um of shape {(*x.shape[:2], 2)}")

    def _embed(self, x: Tensor, coords_um: Tensor | None) -> Tensor:
        """Tile features (B, n, in_dim) of any float dtype -> tokens (B, n, dim)."""
        t = self.proj(x.to(self.proj.weight.dtype))
        if self.config.pos_encoding and coords_um is not None:
            t = t + sincos_from_coords_um(coords_um, self.config.dim, self.config.pos_unit_um).to(t.dtype)
        return t

    def _tokens(
        self, x: Tensor, mask: Tensor | None, coords_um: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), self._embed(x, coords_um)], 1)
        if mask is not None:
            mask = torch.cat([mask.new_ones(x.shape[0], 1), mask], dim=1)  # (B, 1 + N)
        return tokens, mask  # (B, 1 + N, dim)

    # --- forward -------------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        coords_um: Tensor | None = None,
        *,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """x (B, N, in_dim), mask (B, N) bool True = real, coords_um (B, N, 2) -> logits (B, C)."""
        self._check(x, mask, coords_um)
        chunk = max_tokens_per_chunk or self.config.max_tokens_per_chunk
        if chunk and not torch.is_grad_enabled():
            return self._forward_chunked(x, mask, coords_um, chunk)
        tokens, mask = self._tokens(x, mask, coords_um)
        use_ckpt = self.config.checkpointing and self.training
        h = self.transformer(tokens, mask, checkpointing=use_ckpt)
        return self.head(self.norm(h[:, 0]))

    @torch.no_grad()
    def _forward_chunked(
        self, x: Tensor, mask: Tensor | None, coords_um: Tensor | None, chunk: int
    ) -> Tensor:
        b, n, _ = x.shape
        buf = torch.empty(b, n + 1, self.config.dim, dtype=self.proj.weight.dtype, device=x.device)
        buf[:, 0] = self.cls_token[:, 0]
        for sl in chunk_slices(n, chunk):
            c = None if coords_um is None else coords_um[:, sl]
            buf[:, sl.start + 1 : sl.stop + 1] = self._embed(x[:, sl], c)
        if mask is not None:
            mask = torch.cat([mask.new_ones(b, 1), mask], dim=1)
        h = self.transformer.forward_chunked_(buf, mask, chunk)
        return self.head(self.norm(h[:, 0]))

    # --- explanations --------------------------------------------------------------------------------
    def logit_decomposition(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(contrib (B, N, C), base (B, C)) with logits == base + contrib.sum(1); see docs/api.md."""
        self._check(x, mask, coords_um)
        tokens, full_mask = self._tokens(x, mask, coords_um)
        blocks = self.transformer.layers()
        contrib, base = decompose_cls_logits(blocks, self.norm, self.head, tokens, full_mask)
        return contrib[:, 1:], base

    def tile_contributions(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """Each tile's exact additive share of each logit through the last block's attention: (B, N, C).

        0 at padded tiles. Call in eval mode (dropout off).
        """
        return self.logit_decomposition(x, mask, coords_um)[0]

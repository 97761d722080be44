"""ABMIL (preset `abmil`): gated-attention pooling over a bag of tile features (Ilse et al. 2018).

Each tile feature x_k is embedded h_k = ReLU(W_1 x_k) (dropout after), scored
s_k = w^T (tanh(V h_k) * sigmoid(U h_k)) (gated; `attention: plain` drops the sigmoid gate), and the
bag is z = sum_k a_k h_k with a = softmax(s) over the bag's real tiles; logits = W_cls z + b.
Reference read: Ilse, Tomczak & Welling, "Attention-based Deep Multiple Instance Learning", ICML 2018,
eq. 9 (gated attention); AMLab-Amsterdam/AttentionDeepMIL model.py; mahmoodlab/CLAM
models/model_clam.py (Attn_Net_Gated: in -> 512 -> 256, ReLU + dropout 0.25).

It is the small-cohort baseline beside the transformers: 38k parameters for 166-d features at the
Ilse sizes (1.3M at the 2048-d preset), order-invariant by construction (tile coordinates are accepted
and ignored), and its explanation is exact: because the classifier is linear after a convex pooling,
logits = b + sum_k a_k (W_cls h_k), so tile k's contribution is its attention weight times its own
class scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from wsi.core.config import config_dict, config_model
from wsi.core.errors import ConfigError
from wsi.core.json_types import JsonObject
from wsi.models.base.kinds import MODEL_KINDS, KindModel
from wsi.models.layers.pooling import GatedAttentionPool
from wsi.models.layers.standardize import standardize_input
from wsi.models.layers.transformer import MAX_MODEL_INT

_Width = Annotated[int, Field(gt=0, le=MAX_MODEL_INT, strict=True)]
_Rate = Annotated[float, Field(ge=0.0, lt=1.0)]


@config_model
@dataclass(frozen=True)
class ABMILConfig:
    """Architecture of an ABMIL model; parse with `wsi.core.config.parse_config(ABMILConfig, mapping)`."""

    kind: Literal["abmil"] = "abmil"  # model kind (the factory's key)
    attention: Literal["gated", "plain"] = "gated"  # gated: tanh * sigmoid gate (Ilse eq. 9); plain: tanh
    in_dim: _Width = 2048  # bag feature width (RetCCL: 2048; Musk: 166)
    hidden_dim: _Width = 512  # tile embedding width h_k (CLAM: 512 for 1024/2048-d; Ilse Musk: 128)
    attn_dim: _Width = 256  # width of the attention MLP V, U (CLAM: 256; Ilse Musk: 64)
    num_classes: _Width = 2
    dropout: _Rate = 0.25  # after the embedding ReLU and on the gated attention hidden (CLAM: 0.25)
    feature_dropout: _Rate = 0.0  # elementwise dropout on the input tile features, training only
    attention_dropout: _Rate = 0.0  # training only: each tile left out of the softmax with this
    # probability, weights renormalised over the rest (DropAttention with normalised rescaling), never
    # every tile of a bag
    max_tokens_per_chunk: _Width | None = None  # no-grad passes
    # over chunks of this many tiles (exact; bounds memory on huge bags); None = one pass

    def to_dict(self) -> JsonObject:
        return config_dict(self)


@MODEL_KINDS.register("abmil")
class ABMIL(KindModel):
    """Gated-attention MIL with the interface of `models.mil.MILTransformer` (forward, contributions).

    A task names it with `model: {preset: abmil}`; training, checkpoints, cross-validation, prediction
    and heatmaps are the transformers' own (the heatmap of a tile is its exact contribution)."""
    inputs: ClassVar[tuple[str, ...] | None] = ("bags",)

    config_class = ABMILConfig
    config: ABMILConfig

    def __init__(self, config: ABMILConfig) -> None:
        super().__init__()
        self.config = config
        self.feature_dropout = nn.Dropout(config.feature_dropout)
        self.embed = nn.Sequential(
            nn.Linear(config.in_dim, config.hidden_dim), nn.ReLU(), nn.Dropout(config.dropout)
        )
        self.pool = GatedAttentionPool(
            config.hidden_dim, config.attn_dim, gated=config.attention == "gated",
            dropout=config.dropout, attention_dropout=config.attention_dropout,
        )  # fmt: skip
        self.head = nn.Linear(config.hidden_dim, config.num_classes)
        self.register_load_state_dict_pre_hook(_rename_pre_pool_keys)

    # --- pieces --------------------------------------------------------------------------------------
    def _check(self, x: Tensor, mask: Tensor | None) -> None:
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

    def _embed(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """Tile features (B, n, in_dim) of any float dtype -> embeddings h (B, n, hidden_dim).

        Padded rows are zeroed first so that NaN or huge padding can never reach a sum.
        """
        x = standardize_input(self, x).to(self.head.weight.dtype)  # z-scores when the task asked
        if mask is not None:
            x = x.masked_fill(~mask[..., None], 0.0)
        return self.embed(self.feature_dropout(x))

    # --- forward -------------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        coords_um: Tensor | None = None,
        *,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """x (B, N, in_dim), mask (B, N) bool True = real -> logits (B, C). coords_um is ignored."""
        self._check(x, mask)
        chunk = max_tokens_per_chunk or self.config.max_tokens_per_chunk
        if chunk and not torch.is_grad_enabled():
            contrib, base = self._decompose_chunked(x, mask, chunk)
            return base + contrib.sum(1)
        h = self._embed(x, mask)  # (B, N, hidden)
        z, _ = self.pool(h, mask)  # (B, hidden)
        return self.head(z)

    def _decompose_chunked(self, x: Tensor, mask: Tensor | None, chunk: int) -> tuple[Tensor, Tensor]:
        """Contributions and base in chunks of `chunk` tiles: only (B, N) scores and (B, N, C) class
        scores are kept for the whole bag, never the (B, N, hidden) embeddings."""
        b, n, _ = x.shape
        scores = torch.empty(
            b, n, dtype=torch.promote_types(self.head.weight.dtype, torch.float32), device=x.device
        )
        tile_logits = torch.empty(
            b, n, self.config.num_classes, dtype=self.head.weight.dtype, device=x.device
        )
        for start in range(0, n, chunk):
            sl = slice(start, min(start + chunk, n))
            h = self._embed(x[:, sl], None if mask is None else mask[:, sl])  # (B, n_chunk, hidden)
            scores[:, sl] = self.pool.scores(h)
            tile_logits[:, sl] = h @ self.head.weight.T  # (B, n_chunk, C)
        a = self.pool.weights(scores, mask)  # (B, N)
        return a[..., None].to(tile_logits.dtype) * tile_logits, self.head.bias.expand(b, -1)

    # --- explanations --------------------------------------------------------------------------------
    def attention_weights(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """a (B, N): the pooling weights, summing to one over each bag's real tiles, 0 at padding.

        Call in eval mode (dropout and attention dropout off)."""
        self._check(x, mask)
        return self.pool.weights(self.pool.scores(self._embed(x, mask)), mask)

    def logit_decomposition(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(contrib (B, N, C), base (B, C)): contrib[:, k] = a_k * (W_cls h_k), base = the head's bias,
        and logits == base + contrib.sum(1) exactly (up to float rounding). Call in eval mode."""
        self._check(x, mask)
        return self._decompose_chunked(x, mask, max(x.shape[1], 1))

    def tile_contributions(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """Each tile's exact additive share of each logit: (B, N, C), 0 at padded tiles."""
        return self.logit_decomposition(x, mask, coords_um)[0]


def _rename_pre_pool_keys(module: nn.Module, state: dict[str, Tensor], prefix: str, *_: object) -> None:
    """Weights saved before the pooling moved to models.pooling (`attn_v.weight` -> `pool.attn_v.weight`)."""
    for name in ("attn_v", "attn_u", "attn_w"):
        for key in [k for k in state if k.startswith(f"{prefix}{name}.")]:
            state[f"{prefix}pool.{key[len(prefix) :]}"] = state.pop(key)


__all__ = ["ABMIL", "ABMILConfig"]

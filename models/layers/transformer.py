"""Pre-norm transformer blocks, their stack, and what the MIL and image models share on top.

Pre-norm (LayerNorm before attention and MLP, residual around each) keeps deep stacks trainable
without warm-up tricks. The stack offers three ways to run: plain, with activation checkpointing
(training on very long bags), and chunked two-pass inference (bounded memory, exact).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal, Required, TypedDict, Unpack, cast

import torch
from pydantic import Field
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from wsi.core.config import config_dict, config_model
from wsi.core.errors import ConfigError
from wsi.core.json_types import JsonObject
from wsi.models.attention import ATTENTION, AttentionBase, attention_options, build_attention
from wsi.models.attention.grid_conv import MixFFN, PreMix
from wsi.models.layers.chunked import run_chunked

#: the largest width or token count a model config takes (torch sizes are 64-bit; a model this wide
#: is refused by its memory before it is built: `models.presets`)
MAX_MODEL_INT = 2**31 - 1
PositiveInt = Annotated[
    int, Field(strict=True, ge=1, le=MAX_MODEL_INT)
]  # strict: a YAML `true` is not a width of 1

# Measured on the CPU (docs/benchmarks.md, "Long bags"), vit-wsi with 2048-d input: a plain no-grad
# pass holds 20 KB (seqnorm) to 42 KB (gdla) of activations per token and a plain seqnorm training step
# 56 KB (34 KB recomputing blocks in backward), so above 16,384 tokens inference runs chunked and
# training recomputes; chunks of 4,096 tokens keep a 100,000-token forward (2048-d float32 input
# included) under 2 GiB of resident memory for every linear variant.
CHUNK_ABOVE_TOKENS = 16384
AUTO_CHUNK_TOKENS = 4096
CHECKPOINT_ABOVE_TOKENS = 16384


# build_attention options that the model sets from its own fields: allowing them in attention_options
# would silently override attn_dim / dropout and make config_dict describe another model.
_SHADOWED_OPTIONS = {"inner_dim": "attn_dim", "dropout": "dropout"}


def _refuse_shadowed_options(options: Mapping[str, object]) -> None:
    shadowed = sorted(set(options) & set(_SHADOWED_OPTIONS))
    if shadowed:
        use = ", ".join(f"{k} -> {_SHADOWED_OPTIONS[k]}" for k in shadowed)
        raise ConfigError(f"attention_options must not set {shadowed}: set the model fields instead ({use})")


class BlockOptions(TypedDict, total=False):
    """`Block`'s keyword arguments a TransformerConfig decides (`TransformerConfig.block_options`).

    A direct `Block(...)` call may leave out all but `attention`: attn_dim None (the block's width),
    dropout 0, no attention options, no LayerScale, the plain block."""

    attention: Required[str]
    attn_dim: int | None
    dropout: float
    attention_options: JsonObject
    attn_layer_scale: float | None
    paper_block: bool


@config_model
@dataclass
class TransformerConfig:
    """Fields every transformer kind shares (defaults: the paper's Table 1 widths for vit-wsi).

    Types and ranges are checked by `wsi.core.config.parse_config`; `__post_init__` checks what spans fields.
    """

    attention: str = "seqnorm"  # variant name, see models.attention
    # extra build_attention options: keywords of the chosen variant (any registered one), checked against
    # its signature (`attention_options(name)`) below
    attention_options: JsonObject = field(default_factory=dict)
    dim: PositiveInt = 512  # token width D'
    attn_dim: PositiveInt = 512  # inner attention width D (Q, K, V live here)
    depth: PositiveInt = 2  # transformer blocks
    heads: PositiveInt = 8  # attention heads; attn_dim must be divisible by it
    mlp_dim: PositiveInt = 512  # hidden width of each block's MLP
    num_classes: PositiveInt = 2  # logits
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0  # in the MLPs and after attention
    checkpointing: bool = False  # always recompute blocks in backward while training (else: see below)
    # With gradients on, bags longer than this recompute each block in backward (activation
    # checkpointing, same outputs and gradients): memory per tile drops to the block inputs.
    checkpoint_above_tokens: PositiveInt | None = CHECKPOINT_ABOVE_TOKENS
    max_tokens_per_chunk: PositiveInt | None = None  # chunk size for every no-grad pass; None = automatic
    # Without gradients, bags longer than this run chunked (exact; chunks of max_tokens_per_chunk or
    # AUTO_CHUNK_TOKENS), so inference memory stays bounded; None: plain unless max_tokens_per_chunk.
    chunk_above_tokens: PositiveInt | None = CHUNK_ABOVE_TOKENS
    # LayerScale (Touvron et al. 2021, CaiT) on the attention residual: x + diag(s) Attn(LN(x)) with s
    # a learned per-channel scale starting at this value; None: no scale (the paper's blocks). A small
    # start lets a model fitted on few bags begin as a per-tile network and take in the bag context only
    # as far as the data supports it (docs/benchmarks.md, small-cohort MIL).
    attn_layer_scale: Annotated[float, Field(gt=0, le=1e3)] | None = None
    # attention gdla only. `paper`: GDLA's block as in the paper (models.attention.grid_conv): LayerNorm
    # -> SiLU(DWC3x3) -> mixer, and Mix-FFN (eqs. 29-30) for the MLP; lambda, lambda' ~ N(0, 0.1) as the
    # released code draws them. `legacy`: LayerNorm -> mixer, plain MLP, lambda = 0.5: the block of model
    # records saved without this field (models.presets).
    gdla_block: Literal["paper", "legacy"] = "paper"

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION:
            raise ConfigError(f"unknown attention {self.attention!r}; choose one of {ATTENTION.names()}")
        if self.attn_dim % self.heads:
            raise ConfigError(f"attn_dim {self.attn_dim} is not divisible by heads {self.heads}")
        _refuse_shadowed_options(self.attention_options)
        bad = set(self.attention_options) - set(attention_options(self.attention))
        if bad:
            raise ConfigError(f"attention_options {sorted(bad)} are not options of {self.attention!r}")

    def to_dict(self) -> JsonObject:
        """Plain JSON-ready data; `models.presets.build_model_from_config` turns it back into a model."""
        return config_dict(self)

    def chunk_for(self, n_tokens: int, requested: int | None = None) -> int | None:
        """Chunk size for a no-grad pass over `n_tokens` tokens, or None for the plain pass."""
        if requested or self.max_tokens_per_chunk:
            return requested or self.max_tokens_per_chunk
        if self.chunk_above_tokens and n_tokens > self.chunk_above_tokens:
            return AUTO_CHUNK_TOKENS
        return None

    def checkpoint_for(self, n_tokens: int, training: bool) -> bool:
        """Whether a pass with gradients over `n_tokens` tokens recomputes its blocks in backward."""
        if not torch.is_grad_enabled():
            return False
        forced = self.checkpointing and training
        return forced or bool(self.checkpoint_above_tokens and n_tokens > self.checkpoint_above_tokens)

    def block_options(self) -> BlockOptions:
        return {
            "attention": self.attention,
            "attn_dim": self.attn_dim,
            "dropout": self.dropout,
            "attention_options": dict(self.attention_options),
            "attn_layer_scale": self.attn_layer_scale,
            "paper_block": self.attention == "gdla" and self.gdla_block == "paper",
        }


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class Block(nn.Module):
    """x + Attn(LN(x)) (times a per-channel LayerScale when one is set), then x + MLP(LN(x)).

    `paper_block` (gdla): x + Attn(SiLU(DWC3x3(LN(x)))), then x + MixFFN(LN(x))
    (models.attention.grid_conv), the convolutions over the token grid given by `neighbours`.
    """

    def __init__(self, dim: int, heads: int, mlp_dim: int, **options: Unpack[BlockOptions]) -> None:
        super().__init__()
        attention = options["attention"]
        attention_options = options.get("attention_options") or {}
        dropout = options.get("dropout", 0.0)
        attn_layer_scale = options.get("attn_layer_scale")
        paper_block = options.get("paper_block", False)
        _refuse_shadowed_options(attention_options)
        opts = {**attention_options, "inner_dim": options.get("attn_dim"), "dropout": dropout}
        if attention == "gdla" and not paper_block:
            opts.setdefault("lambda_init", 0.5)  # the legacy block's constant start
        self.norm1 = nn.LayerNorm(dim)
        self.attn: AttentionBase = build_attention(attention, dim, heads, **opts)
        self.norm2 = nn.LayerNorm(dim)
        ndim = int(getattr(self.attn, "grid_ndim", 2))
        self.pre: PreMix | None = PreMix(dim, ndim) if paper_block else None
        self.mlp: MLP | MixFFN = (
            MixFFN(dim, mlp_dim, dropout, ndim) if paper_block else MLP(dim, mlp_dim, dropout)
        )
        self.attn_scale = (
            None if attn_layer_scale is None else nn.Parameter(torch.full((dim,), float(attn_layer_scale)))
        )

    def attend(self, t: Tensor) -> Tensor:
        """The attention's output (..., dim) as it enters the residual: scaled by LayerScale if set.

        Every path that adds attention to the residual (plain, chunked, decomposition) goes through here.
        """
        return t if self.attn_scale is None else t * self.attn_scale.to(t.dtype)

    @property
    def needs_neighbours(self) -> bool:
        """Whether this block mixes grid neighbours (its attention's local path or its convolutions)."""
        return self.pre is not None or self.attn.needs_neighbours

    def attn_input(self, x: Tensor, mask: Tensor | None, neighbours: Tensor | None) -> Tensor:
        """What the attention reads: LN(x), or SiLU(DWC3x3(LN(x))) in the paper's gdla block."""
        a = self.norm1(x)
        return a if self.pre is None else self.pre(a, mask, neighbours)

    def feed_forward(self, x: Tensor, mask: Tensor | None, neighbours: Tensor | None) -> Tensor:
        """MLP(LN(x)), or MixFFN(LN(x)) over the grid in the paper's gdla block."""
        if isinstance(self.mlp, MixFFN):
            return self.mlp(self.norm2(x), mask, neighbours)
        return self.mlp(self.norm2(x))

    def forward(self, x: Tensor, mask: Tensor | None = None, neighbours: Tensor | None = None) -> Tensor:
        """x (B, N, dim), mask (B, N), neighbours (B|1, N, T) grid neighbour table
        (models.attention.layout)."""
        x = x + self.attend(self.attn(self.attn_input(x, mask, neighbours), mask, neighbours=neighbours))
        return x + self.feed_forward(x, mask, neighbours)


class Transformer(nn.Module):
    """A stack of pre-norm blocks."""

    def __init__(
        self, depth: int, dim: int, heads: int, mlp_dim: int, **block_options: Unpack[BlockOptions]
    ) -> None:
        super().__init__()
        if depth < 1:
            raise ConfigError(f"depth must be at least 1, got {depth}")
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_dim, **block_options) for _ in range(depth))

    def layers(self) -> list[Block]:
        """The blocks, typed (nn.ModuleList yields plain Modules)."""
        return [cast(Block, blk) for blk in self.blocks]

    @property
    def needs_neighbours(self) -> bool:
        """Whether any block mixes grid neighbours (gdla's local path): callers build a table only then."""
        return any(blk.needs_neighbours for blk in self.layers())

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        neighbours: Tensor | None = None,
        *,
        checkpointing: bool = False,
    ) -> Tensor:
        for blk in self.layers():
            if checkpointing and torch.is_grad_enabled():
                x = checkpoint(blk, x, mask, neighbours, use_reentrant=False)
            else:
                x = blk(x, mask, neighbours)
        return x

    @torch.no_grad()
    def forward_chunked_(
        self,
        x: Tensor,
        mask: Tensor | None,
        chunk: int,
        neighbours: Tensor | None = None,
        order: Tensor | None = None,
    ) -> Tensor:
        """Every block in two passes over chunks of `chunk` tokens, overwriting x (B, N, dim) in place.

        Pass 1 lets the attention accumulate its exact summaries (sums, covariances, K^T V); pass 2
        computes each chunk's output and MLP. Chunks follow `order` (B, N) (raster order for slide
        tiles: a chunk's grid neighbours are then at most one grid row away); `neighbours` is indexed by
        positions in that order. Peak memory: x plus one chunk (and its neighbour rows) of activations.
        """
        if chunk < 1:
            raise ConfigError(f"max_tokens_per_chunk must be at least 1, got {chunk}")
        return run_chunked(self.layers(), x, mask, chunk, neighbours, order)


def decompose_cls_logits(
    blocks: Sequence[Block],
    norm: nn.LayerNorm,
    head: nn.Linear,
    tokens: Tensor,
    mask: Tensor | None = None,
    neighbours: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Split the class-token logits (token 0) into per-token terms of the last block's attention.

    tokens (B, N, dim) enter the stack. Returns (contrib (B, N, C), base (B, C)) with
    logits == base + contrib.sum(1); contrib[:, 0] (the class token itself) is 0 and part of base.
    The final LayerNorm is affine once its scale is fixed at the class token's actual value, so each
    token's last-block attention term maps to the logits exactly along that direct path.
    """
    h = tokens
    for blk in blocks[:-1]:
        h = blk(h, mask, neighbours)
    last = blocks[-1]
    terms = last.attend(
        last.attn.query_contributions(last.attn_input(h, mask, neighbours), mask, 0, neighbours=neighbours)
    )  # (B, N, dim)
    terms = torch.cat([torch.zeros_like(terms[:, :1]), terms[:, 1:]], dim=1)  # class token -> base
    y = last(h, mask, neighbours)[:, 0]  # (B, dim) the class token after the last block
    sigma = torch.sqrt(y.var(-1, unbiased=False, keepdim=True) + norm.eps)  # (B, 1) fixed LN scale

    def affine_part(t: Tensor, scale: Tensor) -> Tensor:  # linear part of head(LN(.)) at fixed scale
        centred = t - t.mean(-1, keepdim=True)
        w = norm.weight if norm.weight is not None else 1.0
        return (centred / scale * w) @ head.weight.T

    contrib = affine_part(terms, sigma.unsqueeze(1))  # (B, N, C)
    rest = y - terms.sum(1)  # class residual, its self-term, MLP output, biases
    bias = (norm.bias @ head.weight.T if norm.bias is not None else 0.0) + head.bias
    base = affine_part(rest, sigma) + bias  # (B, C)
    return contrib, base

"""MILTransformer (preset `vit-wsi`): a class-token transformer over a bag of tile features.

Tiles are unordered: without position encoding the model is invariant to their order. With
`pos_encoding` on, a fixed 2D sine-cosine encoding of the tile coordinates (micrometres, so it means the
same at any magnification) is added to each projected feature. gdla's local path places the tiles on
their slide grid by their coordinates (models.layout); a bag given without coordinates has every tile
alone in its neighbourhood.

Readout (`pool`). `cls` (the paper's vit-wsi) reads the class token after the last block. `gated` pools
the tiles' output tokens with gated attention (models.pooling): with linear attention a class token sees
the bag only through its tokens' mean and covariance, so one positive tile among dozens barely moves
it, while a per-token score and a softmax over the bag can single that tile out (small cohorts with
few positive tiles per slide: `vit-wsi-small`). The final LayerNorm then acts on the pooled bag
vector, not on each token (which would divide out each token's size), and the class token stays in
the sequence as a learned global token every tile can attend to. Either way logits == base + the
tiles' contributions.

Long bags: without gradients a bag longer than `chunk_above_tokens` runs through the exact two-pass
chunked scheme (bounded memory); `logits_from_chunks` does the same for a bag streamed from disk; with
gradients a bag longer than `checkpoint_above_tokens` recomputes its blocks in backward.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from wsi.core.config import MAX_UM, config_model
from wsi.core.errors import ConfigError
from wsi.models.attention.layout import TileLayout, tile_layout
from wsi.models.base.kinds import MODEL_KINDS, KindModel
from wsi.models.layers.chunked import chunk_slices
from wsi.models.layers.pooling import GatedAttentionPool, present_only
from wsi.models.layers.posenc import sincos_from_coords_um
from wsi.models.layers.standardize import standardize_input
from wsi.models.layers.transformer import (
    AUTO_CHUNK_TOKENS,
    PositiveInt,
    Transformer,
    TransformerConfig,
    decompose_cls_logits,
)


@config_model
@dataclass
class MILConfig(TransformerConfig):
    kind: Literal["mil"] = "mil"  # model class (models.kinds)
    in_dim: PositiveInt = 2048  # bag feature width (RetCCL: 2048)
    pos_encoding: bool = False  # add sincos(coords_um / pos_unit_um); off: order-invariant
    pos_unit_um: Annotated[float, Field(gt=0, le=MAX_UM)] = (
        256.0  # micrometres per encoding unit (about one tile)
    )
    # Pitch of the tile grid (gdla's local path: tiles one pitch apart are neighbours); None reads it
    # off each bag as the smallest gap between distinct coordinates (the tile size, or the stride).
    grid_um: Annotated[float, Field(gt=0, le=MAX_UM)] | None = None
    pool: Literal["cls", "gated"] = "cls"  # bag readout: class token | gated attention over tile tokens
    pool_dim: PositiveInt = 128  # hidden width of the gated pooling's attention MLP (pool: gated)
    # pool: gated, training only: each tile left out of the pooling softmax with this probability
    # (renormalised over the rest, never every tile of a bag), as ABMIL's attention_dropout
    pool_dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pool_dropout and self.pool != "gated":
            raise ConfigError(
                f"pool_dropout {self.pool_dropout} acts only with pool: gated (this model reads its class "
                "token); set pool: gated or drop pool_dropout"
            )


@MODEL_KINDS.register("mil")
class MILTransformer(KindModel):
    inputs: ClassVar[tuple[str, ...] | None] = ("bags",)
    config_class = MILConfig
    config: MILConfig
    no_weight_decay = frozenset({"cls_token"})  # parameters AdamW must not decay (models.param_groups)

    def __init__(self, config: MILConfig) -> None:
        super().__init__()
        self.config = config
        self.proj = nn.Linear(config.in_dim, config.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.transformer = Transformer(
            config.depth, config.dim, config.heads, config.mlp_dim, **config.block_options()
        )
        # The final LayerNorm normalises what the head reads: the class token (pool: cls) or the pooled
        # bag vector (pool: gated). Not each tile token before pooling: that divides out a token's size,
        # and a positive tile stands out from the rest by its size along a few directions
        # (docs/benchmarks.md: AUROC 0.59 with per-token LayerNorm on a generated 100-bag cohort).
        self.norm = nn.LayerNorm(config.dim)
        self.pool = (
            GatedAttentionPool(
                config.dim, config.pool_dim, dropout=config.dropout, attention_dropout=config.pool_dropout
            )
            if config.pool == "gated"
            else None
        )
        self.head = nn.Linear(config.dim, config.num_classes)

    # --- inputs --------------------------------------------------------------------------------------
    def _check(self, x: Tensor, mask: Tensor | None, coords_um: Tensor | None) -> None:
        if x.ndim != 3 or x.shape[-1] != self.config.in_dim:
            raise ConfigError(
                f"bag features must be (B, N, {self.config.in_dim}), got {tuple(x.shape)}; "
                "set in_dim to the encoder's feature width"
            )
        if mask is not None and (
            not (mask.dtype == torch.bool or mask.is_floating_point()) or mask.shape != x.shape[:2]
        ):
            raise ConfigError(
                f"mask must be bool {tuple(x.shape[:2])} (True = real tile) or float presence weights, "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )
        if coords_um is not None and coords_um.shape != (*x.shape[:2], 2):
            raise ConfigError(
                f"coords_um must be {(*x.shape[:2], 2)} micrometres, got {tuple(coords_um.shape)}"
            )
        if self.config.pos_encoding and coords_um is None:
            raise ConfigError(f"pos_encoding is on: pass coords_um of shape {(*x.shape[:2], 2)}")

    def _embed(self, x: Tensor, coords_um: Tensor | None) -> Tensor:
        """Tile features (B, n, in_dim) of any float dtype -> tokens (B, n, dim)."""
        x = standardize_input(self, x)  # the training split's z-scores when the task asked (float32)
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

    def layout(self, coords_um: Tensor | None, mask: Tensor | None) -> TileLayout | None:
        """The class token and the tiles on their grid (raster order, neighbours), if a block needs it."""
        if coords_um is None or not self.transformer.needs_neighbours:
            return None
        return tile_layout(coords_um, mask, self.config.grid_um).with_leading(1)

    # --- forward -------------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        coords_um: Tensor | None = None,
        *,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """x (B, N, in_dim), mask (B, N) True = real (or float presence weights), coords_um (B, N, 2)
        -> logits (B, C)."""
        self._check(x, mask, coords_um)
        chunk = self.config.chunk_for(x.shape[1] + 1, max_tokens_per_chunk)
        if chunk and not torch.is_grad_enabled():
            return self._forward_chunked(x, mask, coords_um, chunk)
        h = self._plain(x, mask, coords_um)  # (B, 1 + N, dim)
        if self.pool is None:
            return self.head(self.norm(h[:, 0]))
        return self.readout(h[:, 1:], mask)

    def _plain(self, x: Tensor, mask: Tensor | None, coords_um: Tensor | None) -> Tensor:
        """Every token after the last block (B, 1 + N, dim), one pass (blocks recomputed in backward
        when the bag is long and gradients are on)."""
        layout = self.layout(coords_um, mask)
        tokens, full_mask = self._tokens(x, mask, coords_um)
        ckpt = self.config.checkpoint_for(tokens.shape[1], self.training)
        neighbours = None if layout is None else layout.in_token_order()
        return self.transformer(tokens, full_mask, neighbours, checkpointing=ckpt)

    def tile_tokens(self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None) -> Tensor:
        """The tiles' tokens after the last block (B, N, dim): what `pool: gated` pools."""
        self._check(x, mask, coords_um)
        return self._plain(x, mask, coords_um)[:, 1:]

    def readout(self, h: Tensor, mask: Tensor | None = None) -> Tensor:
        """pool: gated. Tile tokens after the last block (B, N, dim), mask (B, N) -> logits (B, C)."""
        if self.pool is None:
            raise ConfigError("readout pools tile tokens: this model reads its class token (pool: cls)")
        z, _ = self.pool(h, mask)  # (B, dim)
        return self.head(self.norm(z))

    @torch.no_grad()
    def _forward_chunked(
        self, x: Tensor, mask: Tensor | None, coords_um: Tensor | None, chunk: int
    ) -> Tensor:
        b, n, _ = x.shape
        layout = self.layout(coords_um, mask)
        buf = torch.empty(b, n + 1, self.config.dim, dtype=self.proj.weight.dtype, device=x.device)
        buf[:, 0] = self.cls_token[:, 0]
        for sl in chunk_slices(n, chunk):
            c = None if coords_um is None else coords_um[:, sl]
            buf[:, sl.start + 1 : sl.stop + 1] = self._embed(x[:, sl], c)
        if mask is not None:
            mask = torch.cat([mask.new_ones(b, 1), mask], dim=1)
        return self._run_chunked(buf, mask, layout, chunk)

    def _run_chunked(self, buf: Tensor, mask: Tensor | None, layout: TileLayout | None, chunk: int) -> Tensor:
        """Tokens (B, 1 + N, dim) -> logits through the exact two-pass scheme, in raster order if laid out."""
        if layout is None:
            h = self.transformer.forward_chunked_(buf, mask, chunk)
        else:
            h = self.transformer.forward_chunked_(buf, mask, chunk, layout.neighbours, layout.order)
        if self.pool is None:
            return self.head(self.norm(h[:, 0]))
        contrib, base = self._pooled_decomposition(h, mask, chunk)
        return base + contrib.sum(1)

    def _pooled_decomposition(self, h: Tensor, mask: Tensor | None, chunk: int) -> tuple[Tensor, Tensor]:
        """pool: gated. Tokens after the last block (B, 1 + N, dim) -> (contrib (B, N, C), base (B, C)).

        With z = sum_k a_k h_k, the LayerNorm is affine once its scale sigma(z) is fixed at its actual
        value, and centring is linear: logits = W (gamma * (z - mean z) / sigma + beta) + b
        = [W beta + b] + sum_k a_k W (gamma * (h_k - mean h_k)) / sigma, exactly. Runs over chunks of
        `chunk` tiles, keeping only (B, N) scores and (B, N, C) class scores for the bag.
        """
        assert self.pool is not None
        b, n = h.shape[0], h.shape[1] - 1
        acc = torch.promote_types(h.dtype, torch.float32)
        scores = torch.empty(b, n, dtype=acc, device=h.device)
        tile_logits = torch.empty(b, n, self.config.num_classes, dtype=acc, device=h.device)
        tile_mask = None if mask is None else mask[:, 1:]
        w = self.head.weight.to(acc) * self.norm.weight.to(acc)  # (C, dim): W diag(gamma)

        def tiles(sl: slice) -> Tensor:  # (B, n_chunk, dim), absent tiles zeroed
            return present_only(
                h[:, sl.start + 1 : sl.stop + 1], None if tile_mask is None else tile_mask[:, sl]
            )

        for sl in chunk_slices(n, chunk):
            t = tiles(sl)
            scores[:, sl] = self.pool.scores(t)
            ta = t.to(acc)
            centred = ta - ta.mean(-1, keepdim=True)
            tile_logits[:, sl] = centred @ w.T  # (B, n_chunk, C) W (gamma * (h_k - mean h_k))
        a = self.pool.weights(scores, tile_mask)  # (B, N)
        z = torch.zeros(b, self.config.dim, dtype=acc, device=h.device)
        for sl in chunk_slices(n, chunk):
            z += torch.einsum("bn,bnd->bd", a[:, sl].to(acc), tiles(sl).to(acc))
        sigma = torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + self.norm.eps)  # (B, 1)
        contrib = a[..., None].to(acc) * tile_logits / sigma.unsqueeze(1)
        base = self.norm.bias.to(acc) @ self.head.weight.to(acc).T + self.head.bias.to(acc)
        dtype = self.head.weight.dtype
        return contrib.to(dtype), base.expand(b, -1).to(dtype)

    @torch.no_grad()
    def logits_from_chunks(
        self,
        chunks: Iterable[tuple[Tensor, Tensor | None]],
        *,
        n_tiles: int,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """Logits (1, C) of ONE bag read chunk by chunk, e.g. from disk: `chunks` yields
        (feats (n, in_dim) any float dtype, coords_um (n, 2) or None) until `n_tiles` tiles came.

        Equal to `model(all_feats[None], coords_um=all_coords[None])` (the same two-pass scheme), with
        memory for the tokens at model width (n_tiles x dim float32) plus one chunk: a million-tile
        bag of 2048-d features is 4 GB of float16 on disk and about 2 GB here. Call in eval mode.
        """
        if n_tiles < 1:
            raise ConfigError(f"n_tiles must be at least 1, got {n_tiles}")
        chunk = self.config.chunk_for(n_tiles + 1, max_tokens_per_chunk) or AUTO_CHUNK_TOKENS
        device, dtype = self.proj.weight.device, self.proj.weight.dtype
        buf = torch.empty(1, n_tiles + 1, self.config.dim, dtype=dtype, device=device)
        buf[:, 0] = self.cls_token[:, 0]
        coords_all: Tensor | None = None
        done = 0
        for i, (feats, coords) in enumerate(chunks):
            feats = torch.as_tensor(feats, device=device)
            c = None if coords is None else torch.as_tensor(coords, device=device, dtype=torch.float32)
            if feats.ndim != 2 or (c is not None and c.shape != (len(feats), 2)):
                raise ConfigError(
                    f"chunk {i}: expected feats (n, {self.config.in_dim}) and coords_um (n, 2), got "
                    f"{tuple(feats.shape)} and {None if c is None else tuple(c.shape)}"
                )
            if done + len(feats) > n_tiles:
                raise ConfigError(f"chunk {i}: the chunks hold more than n_tiles={n_tiles} tiles")
            self._check(feats[None], None, None if c is None else c[None])
            if (c is None) != (coords_all is None) and done:
                raise ConfigError(f"chunk {i}: give coords_um with every chunk or with none")
            if c is not None and coords_all is None:
                coords_all = torch.empty(1, n_tiles, 2, device=device)
            if c is not None and coords_all is not None:
                coords_all[0, done : done + len(feats)] = c
            for sl in chunk_slices(len(feats), chunk):  # float32 copies of one model chunk at a time
                rows = slice(1 + done + sl.start, 1 + done + sl.stop)
                buf[:, rows] = self._embed(feats[None, sl], None if c is None else c[None, sl])
            done += len(feats)
        if done != n_tiles:
            raise ConfigError(f"the chunks held {done} tiles, not n_tiles={n_tiles}")
        return self._run_chunked(buf, None, self.layout(coords_all, None), chunk)

    # --- explanations --------------------------------------------------------------------------------
    def logit_decomposition(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(contrib (B, N, C), base (B, C)) with logits == base + contrib.sum(1); see docs/api.md."""
        self._check(x, mask, coords_um)
        layout = self.layout(coords_um, mask)
        tokens, full_mask = self._tokens(x, mask, coords_um)
        neighbours = None if layout is None else layout.in_token_order()
        if self.pool is not None:
            h = self.transformer(tokens, full_mask, neighbours)
            return self._pooled_decomposition(h, full_mask, max(x.shape[1], 1))
        blocks = self.transformer.layers()
        contrib, base = decompose_cls_logits(blocks, self.norm, self.head, tokens, full_mask, neighbours)
        return contrib[:, 1:], base

    def tile_contributions(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """Each tile's additive share of each logit: (B, N, C). pool: cls, along the last block's direct
        attention path; pool: gated, exactly its pooling weight times the head's scores of its token
        after the last block (through the final LayerNorm at the pooled vector's scale).

        0 at padded tiles. Call in eval mode (dropout off). See docs/api.md for what it leaves out and
        `models.attribution.tile_effects` for each tile's whole effect.
        """
        return self.logit_decomposition(x, mask, coords_um)[0]

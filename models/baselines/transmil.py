"""TransMIL (preset `transmil`): Shao et al., "TransMIL: Transformer based Correlated Multiple Instance
Learning for Whole Slide Image Classification", NeurIPS 2021. Our own code, read from the authors'
szc19990412/TransMIL models/TransMIL.py @ 9d6aee57c7c7 (and Camelyon/TransMIL.yaml for their training
settings); KatherLab/STAMP src/stamp/modeling/models/trans_mil.py @ c54ce0673962 re-uses the same model
for classification, regression and survival, so every task kind trains it here too.

Per bag: h = ReLU(W x) (in_dim -> 512); the n tiles are padded to the next square side^2 by repeating
the first side^2 - n of them (in bag order), a class token is put first; then a pre-norm Nystrom
attention layer (models.baselines.nystrom: 8 heads of 64, 256 landmarks, 6 pinv iterations, value
convolution of 33, dropout 0.1 after the output projection), PPEG (the tiles as a side x side image:
x + depthwise conv 7x7 + 5x5 + 3x3, the class token untouched), a second attention layer, LayerNorm of
the class token and a linear head. 2,672,146 parameters at the authors' configuration (1024-d input,
two classes), as the authors' model has (tests/models/baselines/test_mil_baselines.py).

Nystrom version (`nystrom_version`). The authors pin nystrom-attention 0.0.9, whose attention returns
the FIRST n rows of its front-padded sequence (models.baselines.nystrom): whenever 1 + side^2 is not a
multiple of 256 every token's residual gets another row's output, the class token a padding row's,
and below 256 tokens every token gets a padding row's (the same global mean for all, plus the value
convolution's reach into the tokens). 0.0.10 fixed it as a padding bug ("fix padding bug"); 0.0.14,
what pip installs today and STAMP vendors, returns the tokens' own rows. Default 0.0.14: attention as
the paper describes it, and the model every TransMIL run here so far trained; "0.0.9" is the
authors' released behaviour, which `--recipe authors` sets (configs/recipes/transmil.yaml) to run
TransMIL as they ran it. On random weights (1024-d, 10-1,000 tiles, 3 seeds) their logits differ by
0.03-0.22.

Bags are read one at a time (a padded batch is split into its bags): square padding and the
convolution are per bag, and the authors train with batch size 1. The order of the tiles matters (PPEG
reads the bag order as an image; our bags are in raster order), so TransMIL is not order-invariant.

Memory. The square padding, PPEG and the landmarks all span the whole sequence, so a bag cannot be cut
into independent chunks. Without gradients, a bag of more than `LEAN_ABOVE_TOKENS` tokens (or any bag
when `max_tokens_per_chunk` is set) runs `NystromAttention.forward_lean`: one head and one chunk of
queries at a time, holding the (N, 512) tokens, their LayerNorm and the attention output plus one
head's (N, 64) q, k, v and (256, N) landmark attention: linear in N, 1.4 GB above the features at
100,000 tiles on the CPU (docs/benchmarks.md), never the (8, N, 256) similarity matrices of all heads
that the one-pass code holds. `logits_from_chunks` builds the token buffer from features streamed off
disk (pipelines.predict.stream), so the features never sit in memory whole. Training holds the
one-pass activations: subsample long bags (--bag-size).

Explanations: no additive per-tile share of the logits exists (two attention layers and a
convolution before the class token), so `tile_contributions` refuses; `attention_weights` is the last
layer's class-token attention row (Nystrom approximation, heads averaged; a padding copy's weight is
added to the tile it copies) and is what `wsi predict` draws.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wsi.core.config import config_dict, config_model
from wsi.core.errors import ConfigError
from wsi.models.base.kinds import MODEL_KINDS, KindModel
from wsi.models.baselines.layers import Rate, Width, bags, check_bags, renamed
from wsi.models.baselines.nystrom import NystromAttention
from wsi.models.layers.standardize import standardize_input

_Width = Width
_Rate = Rate

#: without gradients, bags longer than this (tokens) run the lean O(N dim) attention
LEAN_ABOVE_TOKENS = 16384
_CHANNEL_BLOCK = 64  # PPEG's depthwise convolutions in blocks of channels on long bags


@config_model
@dataclass(frozen=True)
class TransMILConfig:
    """Architecture of TransMIL; defaults are the authors' (TransMIL.py, TransLayer)."""

    kind: Literal["transmil"] = "transmil"
    in_dim: _Width = 1024  # feature width (authors: 1024, truncated ResNet-50)
    dim: _Width = 512  # token width
    heads: _Width = 8  # attention heads (head width dim // heads = 64)
    landmarks: _Width = 256  # Nystrom landmarks (authors: dim // 2)
    pinv_iterations: _Width = 6
    conv_kernel: _Width = 33  # the value convolution along the sequence (odd)
    dropout: _Rate = 0.1  # after each attention's output projection (authors: 0.1)
    nystrom_version: Literal["0.0.14", "0.0.9"] = "0.0.14"  # which rows Nystrom attention returns:
    # 0.0.14 the tokens' own (out[:, -n:]); 0.0.9, the authors' pin, the first n of the padded sequence
    num_classes: _Width = 2
    max_tokens_per_chunk: _Width | None = None  # no-grad: lean attention, this many queries at a time

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ConfigError(f"dim {self.dim} must be a multiple of heads {self.heads}")
        if self.conv_kernel % 2 == 0:
            raise ConfigError(f"conv_kernel must be odd, got {self.conv_kernel}")

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self)


class TransLayer(nn.Module):
    """x + NystromAttention(LayerNorm(x)) (the authors' TransLayer)."""

    def __init__(self, c: TransMILConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(c.dim)
        self.attn = NystromAttention(
            c.dim, heads=c.heads, dim_head=c.dim // c.heads, landmarks=c.landmarks,
            pinv_iterations=c.pinv_iterations, conv_kernel=c.conv_kernel, dropout=c.dropout,
            rows="first" if c.nystrom_version == "0.0.9" else "last",
        )  # fmt: skip

    def forward(self, t: Tensor) -> Tensor:
        return t + self.attn(self.norm(t))

    def lean_(self, buf: Tensor, chunk: int) -> None:
        """The same, in place on one bag's tokens (N, dim), one head and chunk at a time."""
        buf += self.attn.forward_lean(self.norm(buf)[None], chunk)[0].to(buf.dtype)


class PPEG(nn.Module):
    """Pyramid position encoding: tiles as a side x side image, x + DWConv7 + DWConv5 + DWConv3."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv7 = nn.Conv2d(dim, dim, 7, 1, 3, groups=dim)
        self.conv5 = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.conv3 = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)

    def _mix(self, img: Tensor, sl: slice) -> Tensor:
        """img (B, c, side, side) holding channels `sl` -> the encoded channels (authors' order of sums)."""
        c = img.shape[1]

        def conv(layer: nn.Conv2d) -> Tensor:
            bias = None if layer.bias is None else layer.bias[sl]
            return F.conv2d(img, layer.weight[sl], bias, padding=layer.padding, groups=c)

        out = conv(self.conv7) + img
        return out + conv(self.conv5) + conv(self.conv3)

    def forward(self, t: Tensor, side: int) -> Tensor:
        """Tokens (B, 1 + side^2, dim), class token first -> the same shape."""
        b, _, dim = t.shape
        img = t[:, 1:].transpose(1, 2).reshape(b, dim, side, side)
        mixed = self._mix(img, slice(None)).flatten(2).transpose(1, 2)
        return torch.cat([t[:, :1], mixed], dim=1)

    def lean_(self, buf: Tensor, side: int) -> None:
        """In place on one bag's tokens (1 + side^2, dim), a block of channels at a time."""
        dim = buf.shape[1]
        for c0 in range(0, dim, _CHANNEL_BLOCK):
            sl = slice(c0, min(c0 + _CHANNEL_BLOCK, dim))
            img = buf[1:, sl].T.reshape(1, sl.stop - sl.start, side, side)
            buf[1:, sl] = self._mix(img, sl).reshape(sl.stop - sl.start, -1).T


@MODEL_KINDS.register("transmil")
class TransMIL(KindModel):
    inputs: ClassVar[tuple[str, ...] | None] = ("bags",)
    config_class = TransMILConfig
    config: TransMILConfig
    explains_by: ClassVar[str] = "attention"
    no_weight_decay = frozenset({"cls_token"})

    def __init__(self, config: TransMILConfig) -> None:
        super().__init__()
        self.config = config
        self.proj = nn.Linear(config.in_dim, config.dim)  # + ReLU (authors' _fc1)
        self.cls_token = nn.Parameter(torch.randn(1, 1, config.dim))  # authors: randn
        self.layer1, self.layer2 = TransLayer(config), TransLayer(config)
        self.ppeg = PPEG(config.dim)
        self.norm = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.num_classes)

    # --- pieces --------------------------------------------------------------------------------------
    def _embed(self, feats: Tensor) -> Tensor:
        """Tile features (n, in_dim) of any float dtype -> ReLU(W x) (n, dim)."""
        x = standardize_input(self, feats).to(self.proj.weight.dtype)
        return torch.relu(self.proj(x))

    @staticmethod
    def side(n: int) -> int:
        """The square's side: ceil(sqrt(n))."""
        s = math.isqrt(n)
        return s if s * s == n else s + 1

    def _tokens(self, h: Tensor) -> tuple[Tensor, int]:
        """Embedded tiles (n, dim) -> (class token + tiles + padding copies (1 + side^2, dim), side)."""
        side = self.side(h.shape[0])
        add = side * side - h.shape[0]
        return torch.cat([self.cls_token[0].to(h.dtype), h, h[:add]]), side

    def _after_ppeg(self, h: Tensor) -> tuple[Tensor, int]:
        """(tokens entering the last layer (1, 1 + side^2, dim), side) of one bag's embedded tiles."""
        tokens, side = self._tokens(h)
        t = self.layer1(tokens[None])
        return (self.ppeg(t, side) if side else t), side

    def _one(self, feats: Tensor) -> Tensor:
        t, _ = self._after_ppeg(self._embed(feats))
        return self.head(self.norm(self.layer2(t)[:, 0]))

    @torch.no_grad()
    def _run_lean(self, buf: Tensor, side: int, chunk: int) -> Tensor:
        """Tokens (1 + side^2, dim) built by the caller -> logits (1, C), in place on `buf`."""
        self.layer1.lean_(buf, chunk)
        if side:
            self.ppeg.lean_(buf, side)
        self.layer2.lean_(buf, chunk)
        return self.head(self.norm(buf[:1]))

    def _check(self, x: Tensor, mask: Tensor | None) -> None:
        check_bags("transmil", self.config.in_dim, x, mask)

    # --- forward -------------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        coords_um: Tensor | None = None,
        *,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """x (B, N, in_dim), mask (B, N) True = real -> logits (B, C); coords_um is ignored (PPEG reads
        the bag order). Each bag runs alone."""
        self._check(x, mask)
        chunk = max_tokens_per_chunk or self.config.max_tokens_per_chunk
        out = []
        for _, feats in bags(x, mask):
            lean = not torch.is_grad_enabled() and (chunk or feats.shape[0] + 1 > LEAN_ABOVE_TOKENS)
            out.append(self._lean(feats, chunk or 4096) if lean else self._one(feats))
        return torch.cat(out)

    def _lean(self, feats: Tensor, chunk: int) -> Tensor:
        n = feats.shape[0]
        side = self.side(n)
        buf = torch.empty(1 + side * side, self.config.dim, device=feats.device, dtype=self.proj.weight.dtype)
        buf[0] = self.cls_token[0, 0]
        for start in range(0, n, chunk):
            buf[1 + start : 1 + min(start + chunk, n)] = self._embed(feats[start : start + chunk])
        buf[1 + n :] = buf[1 : 1 + side * side - n]
        return self._run_lean(buf, side, chunk)

    @torch.no_grad()
    def logits_from_chunks(
        self,
        chunks: Iterable[tuple[Tensor, Tensor | None]],
        *,
        n_tiles: int,
        max_tokens_per_chunk: int | None = None,
    ) -> Tensor:
        """Logits (1, C) of ONE bag read chunk by chunk (feats (n, in_dim), coords or None) until `n_tiles`
        tiles came: equal to the in-memory forward, holding the (N, dim) tokens and no features."""
        if n_tiles < 1:
            raise ConfigError(f"n_tiles must be at least 1, got {n_tiles}")
        chunk = max_tokens_per_chunk or self.config.max_tokens_per_chunk or 4096
        side = self.side(n_tiles)
        device, dtype = self.proj.weight.device, self.proj.weight.dtype
        buf = torch.empty(1 + side * side, self.config.dim, device=device, dtype=dtype)
        buf[0] = self.cls_token[0, 0]
        done = 0
        for i, (feats, _) in enumerate(chunks):
            feats = torch.as_tensor(feats, device=device)
            self._check(feats[None], None)
            if done + len(feats) > n_tiles:
                raise ConfigError(f"chunk {i}: the chunks hold more than n_tiles={n_tiles} tiles")
            for start in range(0, len(feats), chunk):
                part = feats[start : start + chunk]
                buf[1 + done + start : 1 + done + start + len(part)] = self._embed(part)
            done += len(feats)
        if done != n_tiles:
            raise ConfigError(f"the chunks held {done} tiles, not n_tiles={n_tiles}")
        buf[1 + n_tiles :] = buf[1 : 1 + side * side - n_tiles]
        return self._run_lean(buf, side, chunk)

    # --- explanations --------------------------------------------------------------------------------
    @torch.no_grad()
    def attention_weights(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """(B, N): the last layer's class-token attention over each bag's tiles (heads averaged, padding
        copies added to the tiles they copy), 0 at padded positions. Call in eval mode."""
        self._check(x, mask)
        out = torch.zeros(x.shape[:2], device=x.device)
        for b, feats in bags(x, mask):
            n = feats.shape[0]
            if n == 0:
                continue
            t, side = self._after_ppeg(self._embed(feats))
            row = self.layer2.attn.query_attention(self.layer2.norm(t), 0).mean(1)[0]  # (1 + side^2,)
            tiles = row[1 : 1 + n].clone()
            add = side * side - n
            tiles[:add] += row[1 + n :]
            where = torch.arange(x.shape[1], device=x.device) if mask is None else mask[b].nonzero()[:, 0]
            out[b, where] = tiles.float()
        return out

    def tile_contributions(
        self, x: Tensor, mask: Tensor | None = None, coords_um: Tensor | None = None
    ) -> Tensor:
        """Refused: TransMIL's logits have no additive per-tile decomposition (see the module docstring)."""
        raise ConfigError(
            "transmil: per-tile contributions are not defined: the class token reads the bag through two "
            "Nystrom attention layers and the PPEG convolution, so no tile has an additive share of the "
            "logits; use attention_weights (what `wsi predict` draws for TransMIL)"
        )


#: the authors' state-dict prefixes (TransMIL.py) -> ours
AUTHORS_KEYS = {
    "_fc1.0": "proj", "cls_token": "cls_token", "norm": "norm", "_fc2": "head",
    "pos_layer.proj": "ppeg.conv7", "pos_layer.proj1": "ppeg.conv5", "pos_layer.proj2": "ppeg.conv3",
    **{
        f"layer{i}.{a}": f"layer{i}.{b}" for i in (1, 2)
        for a, b in (("norm", "norm"), ("attn.to_qkv", "attn.to_qkv"), ("attn.to_out.0", "attn.to_out"),
                     ("attn.res_conv", "attn.res_conv"))
    },
}  # fmt: skip


def from_authors_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A state dict of the authors' TransMIL (e.g. a checkpoint's `model.` entries) in our layout."""
    return renamed(state, AUTHORS_KEYS)


__all__ = ["AUTHORS_KEYS", "LEAN_ABOVE_TOKENS", "TransMIL", "TransMILConfig", "from_authors_state_dict"]

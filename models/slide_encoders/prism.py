"""PRISM's slide encoder: a Perceiver over Virchow (v1) tile embeddings (Shaikovski et al. 2024, Paige).

The authors publish the code only in their Hugging Face repository (paige-ai/Prism); we follow its
verbatim copy in DIAGNijmegen/unicorn_baseline dec3809 (src/unicorn_baseline/vision_language/prism/, which
loads model.safetensors strictly) and how TRIDENT a91fa84 (PRISMSlideEncoder) and STAMP c54ce06
(encoder/prism.py) call it: the embedding is `slide_representations(x)["image_embedding"]`, 1280-d.
config.json: 513 latents of width 1280; 8 Perceiver layers, each a single-head cross-attention on the raw
tile embeddings (`c_norm=False`, bias-free to_kv) + GEGLU, then a 6-block latent transformer. Shared as
the authors share them: layers 1-7 one cross-attention (`share_xattn_start_layer=1`), all 8 one latent
transformer (`share_tf_start_layer=0`). Embedding: LayerNorm(class latent) (`cls_norm`). No positional
encoding (row order cannot matter). Tiles: Virchow v1 class + mean token (2560), 224 px at 0.5 um/px.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from wsi.core.errors import WeightsError
from wsi.models.slide_encoders import base
from wsi.models.slide_encoders.base import SLIDE_ENCODERS, SlideEncoder, SlideEncoderSpec, StateDict

log = logging.getLogger("wsi.models.slide_encoders.prism")

#: checkpoint tensors that belong to the text side only (BioGPT decoder, text projection, CLIP logit
#: scale): skipped by exact prefix, so every other tensor of the full checkpoint is still checked
TEXT_PREFIXES = ("text_decoder.", "text_to_latents.", "temperature")
_RESAMPLER = "image_resampler."


@dataclass(frozen=True)
class PerceiverConfig:
    """configuring_prism.PerceiverConfig as config.json sets it (tests shrink it)."""

    latent_seq: int = 512  # image latents (+1 class latent)
    latent_dim: int = 1280
    context_dim: int = 2560  # Virchow class token + mean patch token
    mhsa_heads: int = 8
    perceiver_depth: int = 8
    transformer_depth: int = 6
    share_xattn_start_layer: int = 1  # layers after this one reuse its cross-attention
    share_tf_start_layer: int = 0  # layers after this one reuse its latent transformer
    xattn_heads: int = 1
    dim_latents: int = 5120  # PrismConfig.dim_latents: width of the contrastive projection


class _GegluFeedForward(nn.Module):
    """LayerNorm -> Linear(d, 2d) -> value * gelu(gate) -> Linear(d, d) (perceiver.py FeedForward, mult 1)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.fc1(self.norm(x)).chunk(2, dim=-1)
        return self.fc2(value * F.gelu(gate))


class _CrossAttention(nn.Module):
    """Latents (queries) on the tile embeddings; bias-free projections, no norm on the context."""

    def __init__(self, cfg: PerceiverConfig) -> None:
        super().__init__()
        self.heads = cfg.xattn_heads
        self.head_dim = cfg.latent_dim // cfg.xattn_heads
        inner = self.heads * self.head_dim
        self.x_norm = nn.LayerNorm(cfg.latent_dim)
        self.to_q = nn.Linear(cfg.latent_dim, inner, bias=False)
        self.to_kv = nn.Linear(cfg.context_dim, 2 * inner, bias=False)
        self.to_out = nn.Linear(inner, cfg.latent_dim, bias=False)
        self.ff = _GegluFeedForward(cfg.latent_dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """x (L, latent_dim), context (N, context_dim) -> attention output (L, latent_dim), chunked over N.

        The authors hold keys and values for every tile (1 GB at 100,000 tiles in float32) and a 513 x N
        score matrix. Here the projections fold into the queries and the output (scores = (q W_k) c^T,
        output = (softmax(scores) c) W_v^T: exact, since to_kv has no bias and the context no norm), and
        the softmax runs over `CHUNK_TILES` tiles at a time with a running maximum. The authors' float
        tile mask of ones is added to every score and cancels in the softmax (batch of one)."""
        lat, h, d = x.shape[0], self.heads, self.head_dim
        w_k, w_v = self.to_kv.weight.float().chunk(2, dim=0)  # (h*d, C) each: k = c W_k^T, v = c W_v^T
        q = self.to_q(self.x_norm(x)).view(lat, h, d).transpose(0, 1) * d**-0.5  # (h, L, d)
        qk = q @ w_k.view(h, d, -1)  # (h, L, C): scores are qk @ c^T
        run_max = torch.full((h, lat, 1), -math.inf, device=x.device)
        total = torch.zeros((h, lat, 1), device=x.device)
        acc = torch.zeros((h, lat, context.shape[1]), device=x.device)
        chunk = base.CHUNK_TILES  # read now: the benchmark sets it to N to measure one pass
        for start in range(0, context.shape[0], chunk):
            c = context[start : start + chunk].float()
            s = qk @ c.T  # (h, L, n)
            new_max = torch.maximum(run_max, s.amax(-1, keepdim=True))
            scale = torch.exp(run_max - new_max)
            p = torch.exp(s - new_max)
            total = total * scale + p.sum(-1, keepdim=True)
            acc = acc * scale + p @ c
            run_max = new_max
        ctx = acc / total  # (h, L, C): softmax-weighted mean of the context per head
        out = (ctx @ w_v.view(h, d, -1).transpose(1, 2)).transpose(0, 1).reshape(lat, h * d)
        return self.to_out(out)


class _SelfAttentionBlock(nn.Module):
    """LayerNorm -> 8-head bias-free nn.MultiheadAttention (perceiver.py MHSA), then a GEGLU feed-forward."""

    def __init__(self, cfg: PerceiverConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cfg.latent_dim)
        self.mha = nn.MultiheadAttention(cfg.latent_dim, cfg.mhsa_heads, bias=False, batch_first=True)
        self.ff = _GegluFeedForward(cfg.latent_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)[None]
        x = x + self.mha(h, h, h, need_weights=False)[0][0]
        return x + self.ff(x)


class PrismEncoder(SlideEncoder):
    """Virchow tile embeddings (N, 2560) -> PRISM `image_embedding` (1280)."""

    CONFIG = PerceiverConfig()

    def __init__(self, cfg: PerceiverConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or self.CONFIG
        self.cfg = cfg
        self.latents = nn.Parameter(torch.randn(cfg.latent_seq + 1, cfg.latent_dim))
        n_xattn = min(cfg.share_xattn_start_layer, cfg.perceiver_depth - 1) + 1
        n_tf = min(cfg.share_tf_start_layer, cfg.perceiver_depth - 1) + 1
        self.xattn = nn.ModuleList([_CrossAttention(cfg) for _ in range(n_xattn)])
        self.tf = nn.ModuleList(
            [
                nn.ModuleList([_SelfAttentionBlock(cfg) for _ in range(cfg.transformer_depth)])
                for _ in range(n_tf)
            ]
        )
        self.cls_norm = nn.LayerNorm(cfg.latent_dim)
        self.img_norm = nn.LayerNorm(cfg.latent_dim)  # the image latents' norm (text decoder input)
        self.img_to_latents = nn.Linear(cfg.latent_dim, cfg.dim_latents, bias=False)

    def encode(
        self, feats: torch.Tensor, coords_um: torch.Tensor | None, tile_um: float
    ) -> torch.Tensor:
        del coords_um, tile_um  # the Perceiver has no positional encoding
        if feats.shape[0] == 0:
            raise ValueError("an empty bag has no slide embedding")
        x = self.latents.float()
        for i in range(self.cfg.perceiver_depth):
            xattn = cast(_CrossAttention, self.xattn[min(i, len(self.xattn) - 1)])
            x = x + xattn(x, feats)
            x = x + xattn.ff(x)
            for block in cast(nn.ModuleList, self.tf[min(i, len(self.tf) - 1)]):
                x = block(x)
        return self.cls_norm(x[0]).float()

    def authors_to_ours(self, state: StateDict) -> StateDict:
        """Prism checkpoint names -> ours; shared layers may be stored once (safetensors) or per layer.

        The text side (`TEXT_PREFIXES`: BioGPT decoder, contrastive text head) never touches the image
        embedding and is skipped by name; every other tensor is checked. `img_to_latents` loads but is
        not applied: the authors' `image_embedding` is taken before it."""
        out: StateDict = {}
        source: dict[str, str] = {}
        skipped = 0
        for key, value in state.items():
            if key.startswith(TEXT_PREFIXES):
                skipped += 1
                continue
            ours = self._our_name(key)
            if ours in out:  # a shared layer saved under each layer's name: it must be the same tensor
                if out[ours].shape != value.shape or not torch.equal(out[ours], value):
                    raise WeightsError(
                        f"checkpoint tensors {source[ours]} and {key} differ, but PRISM shares them "
                        "(share_xattn_start_layer=1, share_tf_start_layer=0): not a PRISM checkpoint"
                    )
                continue
            out[ours], source[ours] = value, key
        if skipped:
            log.info("PRISM: %d text-side tensors skipped (the slide embedding does not use them)", skipped)
        return out

    def _our_name(self, key: str) -> str:
        m = re.match(r"image_resampler\.perceiver\.layers\.(\d+)\.(xattn|tf)\.(.+)$", key)
        if m:
            layer, part, rest = int(m[1]), m[2], m[3]
            if part == "xattn":
                rest = re.sub(r"^xattn\.", "", rest)  # ModuleDict {"xattn": CrossAttention, "ff": ...}
                return f"xattn.{min(layer, len(self.xattn) - 1)}.{_ff(rest)}"
            j = re.match(r"(\d+)\.(mhsa|ff)\.(.+)$", rest)
            if j:
                inner = j[3] if j[2] == "mhsa" else _ff("ff." + j[3])
                return f"tf.{min(layer, len(self.tf) - 1)}.{j[1]}.{inner}"
            return key
        if key == _RESAMPLER + "perceiver.latents":
            return "latents"
        if key.startswith((_RESAMPLER + "cls_norm.", _RESAMPLER + "img_norm.")):
            return key.removeprefix(_RESAMPLER)
        if key == "img_to_latents.to_latents.weight":
            return "img_to_latents.weight"
        return key  # anything else is reported as unexpected by load_checked


def _ff(rest: str) -> str:
    """FeedForward.net is Sequential(Linear, GEGLU, Linear, Dropout): net.0 -> fc1, net.2 -> fc2."""
    return re.sub(r"^ff\.net\.([02])\.", lambda m: "ff.fc1." if m[1] == "0" else "ff.fc2.", rest)


# parameters (config.json): latents 513*1280 + 2 cross-attentions (x_norm, to_q, to_kv 2560->2560,
# to_out, GEGLU ff) + 6 self-attention blocks (norm, in_proj 3*1280^2, out_proj, ff) + 2 norms
# = 99,037,440 for the Perceiver, + 6,553,600 for img_to_latents
@SLIDE_ENCODERS.register("prism")
class Prism(PrismEncoder):
    """PRISM (paige-ai/Prism) on Virchow v1 class + mean-patch tile embeddings."""

    SPEC = SlideEncoderSpec(
        tile_encoders=("virchow",), tile_um=112.0, tile_mpp=0.5, in_dim=2560, dim=1280,
        params=105_591_040,
        licence="CC-BY-NC-ND 4.0 (non-commercial academic research; gated on Hugging Face)",
        weights_page="https://huggingface.co/paige-ai/Prism",
        weights_files=("model.safetensors", "pytorch_model.bin"),
        reference="paige-ai/Prism modeling_prism.py + perceiver.py, as copied in DIAGNijmegen/"
        "unicorn_baseline dec3809 src/unicorn_baseline/vision_language/prism/; mahmoodlab/TRIDENT a91fa84 "
        "trident/slide_encoder_models/load.py PRISMSlideEncoder",
        uses_positions=False, patient_fusion="early",  # STAMP _generate_patient_embedding: tiles concatenated
    )  # fmt: skip

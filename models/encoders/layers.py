"""The few layers the named encoders need beyond timm: CTransPath's stem and the pooling heads.

Pooling turns a backbone's output into one vector per tile; each head is registered in `POOLINGS` under the
name a recipe gives in `pooling`, and sees the backbone so it can ask for the token sequence.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from wsi.core.registry import Registry


class ConvStem(nn.Module):
    """CTransPath's patch embedding: two stride-2 3x3 conv + BN + ReLU stages, then a 1x1 conv to the width.

    Written from the CTransPath paper (Wang et al. 2022, Medical Image Analysis) and checked against the
    layer names of its published checkpoint (`patch_embed.proj.{0,1,3,4,6}`, `patch_embed.norm`), as read
    in KatherLab/STAMP src/stamp/preprocessing/extractor/ctranspath.py (_ConvStem) and mahmoodlab/TRIDENT
    trident/patch_encoder_models/model_zoo/ctranspath/ctran.py. Takes timm's Swin embed_layer arguments and
    returns NHWC tokens as timm's Swin expects (the original returned NLC for the old Swin layout).
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 4,
        in_chans: int = 3,
        embed_dim: int = 96,
        norm_layer: Any = None,
        **_: Any,  # strict_img_size, output_fmt, device, dtype: timm's PatchEmbed arguments, not needed here
    ) -> None:
        super().__init__()
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        patch = patch_size if isinstance(patch_size, int) else patch_size[0]
        if patch != 4 or embed_dim % 8:
            raise ValueError(
                f"ConvStem needs patch_size 4 and embed_dim divisible by 8, got {patch}, {embed_dim}"
            )
        self.img_size = size
        self.patch_size = (4, 4)
        self.grid_size = (size[0] // 4, size[1] // 4)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        width = embed_dim // 8
        self.proj = nn.Sequential(
            nn.Conv2d(in_chans, width, kernel_size=3, stride=2, padding=1, bias=False),  # proj.0
            nn.BatchNorm2d(width),  # proj.1
            nn.ReLU(inplace=True),
            nn.Conv2d(width, 2 * width, kernel_size=3, stride=2, padding=1, bias=False),  # proj.3
            nn.BatchNorm2d(2 * width),  # proj.4
            nn.ReLU(inplace=True),
            nn.Conv2d(2 * width, embed_dim, kernel_size=1),  # proj.6
        )
        self.norm = norm_layer(embed_dim) if norm_layer else nn.Identity()

    def set_input_size(self, img_size: Any = None, patch_size: Any = None) -> None:
        if img_size is not None:
            size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
            self.img_size, self.grid_size = size, (size[0] // 4, size[1] // 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)  # (B, C, H/4, W/4)
        return self.norm(x.permute(0, 2, 3, 1))  # (B, H/4, W/4, C)


# ------------------------------------------------------------------------------------------- pooling
def _tokens(backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The token sequence after the final norm, (B, N, D), from a timm ViT."""
    tokens: torch.Tensor = cast(Any, backbone).forward_features(x)
    return tokens


POOLINGS: Registry[type[nn.Module]] = Registry("pooling")


@POOLINGS.register("model")
class ModelHead(nn.Module):
    """The backbone's own pooled output (timm with num_classes=0): global average for CNNs and Swin."""

    def __init__(self, backbone: nn.Module, dim: int) -> None:
        super().__init__()

    def forward(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return backbone(x)  # (B, D)


@POOLINGS.register("cls")
class ClassToken(nn.Module):
    """The class token after the final norm (UNI, H-optimus, Prov-GigaPath, Phikon-v2)."""

    def __init__(self, backbone: nn.Module, dim: int) -> None:
        super().__init__()

    def forward(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return _tokens(backbone, x)[:, 0]  # (B, N, D) -> (B, D)


@POOLINGS.register("cls+mean")
class ClassAndPatchMean(nn.Module):
    """[class token, mean of patch tokens] (Virchow2): registers are neither, so they are skipped."""

    def __init__(self, backbone: nn.Module, dim: int) -> None:
        super().__init__()
        self.skip = int(getattr(backbone, "num_prefix_tokens", 1))  # class + register tokens

    def forward(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        tokens = _tokens(backbone, x)  # (B, 1 + R + P, D)
        return torch.cat([tokens[:, 0], tokens[:, self.skip :].mean(dim=1)], dim=-1)  # (B, 2D)


@POOLINGS.register("cls-proj")
class ClassTokenProjection(nn.Module):
    """The class token after the final norm, times the checkpoint's image projection (no bias): a CLIP
    image tower's output in the joint image-text space (PLIP: transformers CLIPModel.get_image_features =
    visual_projection(post_layernorm(class token)))."""

    def __init__(self, backbone: nn.Module, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(int(cast(Any, backbone).num_features), dim, bias=False)

    def forward(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.proj(_tokens(backbone, x)[:, 0])  # (B, N, D) -> (B, dim)


class _QueryPool(nn.Module):
    """The frame both CONCH poolers share: one learned query (LayerNorm ln_q) attends over the backbone's
    tokens (LayerNorm ln_k), and the pooled vector is LayerNorm'd (norm); subclasses add the attention."""

    heads = 8

    def __init__(self, backbone: nn.Module, dim: int) -> None:
        super().__init__()
        self.context = int(cast(Any, backbone).num_features)
        self.query = nn.Parameter(torch.zeros(1, dim))
        self.ln_q = nn.LayerNorm(dim)
        self.ln_k = nn.LayerNorm(self.context)
        self.norm = nn.LayerNorm(dim)

    def keys(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.ln_k(_tokens(backbone, x))  # (B, N, C)


@POOLINGS.register("attn-pool")
class AttentionPool(_QueryPool):
    """CONCH's contrastive pooler: one learned query attends over all tokens, then LayerNorm.

    Written from the CONCH v1.5 vision tower as published in mahmoodlab/TRIDENT
    trident/patch_encoder_models/model_zoo/conchv1_5/conchv1_5.py (AttentionalPooler, n_queries=1,
    8 heads, LayerNorm on queries and keys, no biases; then ln_contrast). Parameter names follow ours;
    the checkpoint's names are mapped in weights.py (key layout "conch-v1.5").
    """

    def __init__(self, backbone: nn.Module, dim: int) -> None:
        super().__init__(backbone, dim)
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_kv = nn.Linear(self.context, 2 * dim, bias=False)
        self.to_out = nn.Linear(dim, dim, bias=False)

    def forward(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        tokens = self.keys(backbone, x)  # (B, N, C)
        b, n, _ = tokens.shape
        h = self.heads
        q = self.to_q(self.ln_q(self.query)).view(1, h, 1, -1).expand(b, -1, -1, -1)  # (B, h, 1, d)
        k, v = self.to_kv(tokens).chunk(2, dim=-1)  # (B, N, D) each
        k = k.view(b, n, h, -1).transpose(1, 2)  # (B, h, N, d)
        v = v.view(b, n, h, -1).transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(q, k, v)  # (B, h, 1, d)
        out = self.to_out(out.transpose(1, 2).reshape(b, -1))  # (B, D)
        return self.norm(out)


class _MhaWeights(nn.Module):
    """torch.nn.MultiheadAttention's tensor names when kdim/vdim differ from the model width."""

    def __init__(self, dim: int, context: int) -> None:
        super().__init__()
        self.q_proj_weight = nn.Parameter(torch.zeros(dim, dim))
        self.k_proj_weight = nn.Parameter(torch.zeros(dim, context))
        self.v_proj_weight = nn.Parameter(torch.zeros(dim, context))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)


@POOLINGS.register("mha-pool")
class MhaAttentionPool(_QueryPool):
    """CONCH v1's contrastive pooler: one learned query, 8-head attention with biases, then LayerNorm.

    Written from mahmoodlab/CONCH 141cc09 conch/open_clip_custom/transformer.py AttentionalPooler (an
    nn.MultiheadAttention(512, 8, kdim=768, vdim=768) over ln_k(tokens), query ln_q(query)) and
    vision_tower.py `forward_no_head` (ln_contrast, no proj_contrast: `encode_image(proj_contrast=False)`).
    """

    def __init__(self, backbone: nn.Module, dim: int) -> None:
        super().__init__(backbone, dim)
        self.attn = _MhaWeights(dim, self.context)

    def forward(self, backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        tokens = self.keys(backbone, x)  # (B, N, C)
        b, n, _ = tokens.shape
        a, h = self.attn, self.heads
        bq, bk, bv = a.in_proj_bias.chunk(3)
        q = nn.functional.linear(self.ln_q(self.query), a.q_proj_weight, bq)  # (1, D)
        q = q.view(1, h, 1, -1).expand(b, -1, -1, -1)  # (B, h, 1, d)
        k = nn.functional.linear(tokens, a.k_proj_weight, bk).view(b, n, h, -1).transpose(1, 2)
        v = nn.functional.linear(tokens, a.v_proj_weight, bv).view(b, n, h, -1).transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(q, k, v)  # (B, h, 1, d)
        return self.norm(a.out_proj(out.transpose(1, 2).reshape(b, -1)))


__all__ = [
    "POOLINGS",
    "AttentionPool",
    "ClassAndPatchMean",
    "ClassToken",
    "ClassTokenProjection",
    "ConvStem",
    "MhaAttentionPool",
    "ModelHead",
]

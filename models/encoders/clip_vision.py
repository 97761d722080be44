"""A CLIP image tower saved by transformers (PLIP's vinid/plip checkpoint) loaded into timm's ViT.

transformers' CLIPModel names the vision tower `vision_model.*` (CLIPVisionEmbeddings: class_embedding,
patch_embedding without bias, position_embedding; pre_layrnorm, sic; encoder.layers.N with separate
q/k/v/out projections, layer_norm1/2, mlp.fc1/fc2; post_layernorm on the class token) and the joint-space
projection `visual_projection` (no bias). timm's `vit_base_patch32_clip_quickgelu_224` (pre_norm, class
token, LayerNorm eps 1e-5, quick_gelu) computes the same function with a packed qkv and its own names;
this key layout ("hf-clip") maps one onto the other. The text tower's tensors (`text_model.*`,
`text_projection`, `logit_scale`) belong to wsi.models.text_encoders and are dropped by the recipe.
Checked against huggingface/transformers src/transformers/models/clip/modeling_clip.py (000f1ff:
CLIPVisionTransformer.forward, CLIPModel.get_image_features) in tests/models/encoders/test_encoder_plip.py.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from wsi.core.errors import WeightsError
from wsi.models.encoders.weights import KEY_LAYOUTS, StateDict

_LAYER = re.compile(r"^vision_model\.encoder\.layers\.(\d+)\.(.+)$")
#: transformers CLIPEncoderLayer names -> timm Block names (q/k/v are packed separately)
_BLOCK = {
    "layer_norm1.": "norm1.",
    "layer_norm2.": "norm2.",
    "self_attn.out_proj.": "attn.proj.",
    "mlp.fc1.": "mlp.fc1.",
    "mlp.fc2.": "mlp.fc2.",
}
_TOP = {
    "vision_model.embeddings.patch_embedding.weight": "backbone.patch_embed.proj.weight",
    "vision_model.pre_layrnorm.weight": "backbone.norm_pre.weight",
    "vision_model.pre_layrnorm.bias": "backbone.norm_pre.bias",
    "vision_model.post_layernorm.weight": "backbone.norm.weight",
    "vision_model.post_layernorm.bias": "backbone.norm.bias",
    "visual_projection.weight": "pool.proj.weight",
}


@KEY_LAYOUTS.register("hf-clip")
def hf_clip_layout(state: StateDict, encoder: nn.Module) -> StateDict:
    """transformers CLIPModel / CLIPVisionModelWithProjection names -> backbone.* (timm ViT) and pool.proj."""
    out: StateDict = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        if key == "vision_model.embeddings.class_embedding":
            out["backbone.cls_token"] = value.reshape(1, 1, -1)  # (D,) -> timm's (1, 1, D)
        elif key == "vision_model.embeddings.position_embedding.weight":
            out["backbone.pos_embed"] = value.unsqueeze(0)  # (1 + P, D) -> (1, 1 + P, D), class first
        elif key in _TOP:
            out[_TOP[key]] = value
        elif m := _LAYER.match(key):
            block, rest = m[1], m[2]
            if p := re.match(r"^self_attn\.(q|k|v)_proj\.(weight|bias)$", rest):
                qkv.setdefault(f"backbone.blocks.{block}.attn.qkv.{p[2]}", {})[p[1]] = value
                continue
            for theirs, ours in _BLOCK.items():
                if rest.startswith(theirs):
                    rest = ours + rest[len(theirs) :]
                    break
            out[f"backbone.blocks.{block}.{rest}"] = value  # an unknown name is reported as unexpected
        else:
            out[key] = value  # reported as unexpected by the key check
    for key, parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            block, kind = key.split(".")[2], key.rsplit(".", 1)[1]
            missing = ", ".join(f"{p}_proj.{kind}" for p in sorted({"q", "k", "v"} - set(parts)))
            raise WeightsError(
                f"the checkpoint's vision_model.encoder.layers.{block}.self_attn lacks {missing}; "
                "is it a CLIP checkpoint saved by transformers (CLIPModel)?"
            )
        out[key] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)  # timm's packed (3D, D) / (3D,)
    return out


__all__ = ["hf_clip_layout"]

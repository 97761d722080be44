"""The tiny MIL transformers the model tests share: the variants, a small width, the readouts, a factory."""

from __future__ import annotations

import torch

from wsi.models.presets import build_model

VARIANTS = ["seqnorm", "softmax", "sima", "gdla"]
TINY = {"dim": 32, "attn_dim": 16, "heads": 4, "mlp_dim": 48, "depth": 2}
# How the bag is read (models.mil): the class token (the paper's), the class token with LayerScale on
# the attention residual, and gated attention pooling over the tile tokens (vit-wsi-small's readout).
READOUTS = {
    "cls": {},
    "cls-scaled": {"attn_layer_scale": 0.3},
    "gated": {"pool": "gated", "pool_dim": 12, "attn_layer_scale": 0.5},
}


def tiny_mil(attention: str, **kw: object) -> torch.nn.Module:
    """vit-wsi at TINY width (20-d tiles, 3 classes), seeded, in eval mode."""
    torch.manual_seed(0)
    return build_model("vit-wsi", attention=attention, in_dim=20, num_classes=3, **{**TINY, **kw}).eval()

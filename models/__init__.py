"""Models: patch encoders, attention variants and the transformers built from them.

Public API (see docs/api.md):
  build_attention(name, dim, heads, **options)  -> nn.Module, forward(x, mask=None)
  build_model(preset, attention=..., in_dim=..., num_classes=..., **overrides) -> nn.Module
  build_encoder(name, weights=..., random_init=...) -> Encoder
  param_groups(model, weight_decay) -> AdamW parameter groups (no decay on norms, biases, tokens)
  tile_effects(model, x, mask, coords_um) -> each tile's leave-one-out effect on the logits
  base_share(contrib, base) -> the share of a logit decomposition that `base` carries
  list_attention(), list_encoders(), list_models() -> names

Importing the package imports no torch: each name loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wsi.core.lazy import lazy_exports

if TYPE_CHECKING:
    from wsi.models.attention import available_attention, build_attention, list_attention
    from wsi.models.base.param_groups import param_groups
    from wsi.models.encoders import available_encoders, build_encoder, list_encoders
    from wsi.models.explain.attribution import base_share, tile_effects
    from wsi.models.presets import available_presets, build_model, list_models
else:
    __getattr__, __dir__ = lazy_exports(__name__, {
        "wsi.models.attention": ("available_attention", "build_attention", "list_attention"),
        "wsi.models.base.param_groups": ("param_groups",),
        "wsi.models.encoders": ("available_encoders", "build_encoder", "list_encoders"),
        "wsi.models.explain.attribution": ("base_share", "tile_effects"),
        "wsi.models.presets": ("available_presets", "build_model", "list_models"),
    })  # fmt: skip

__all__ = [
    "available_attention",
    "available_encoders",
    "available_presets",
    "base_share",
    "build_attention",
    "build_encoder",
    "build_model",
    "list_attention",
    "list_encoders",
    "list_models",
    "param_groups",
    "tile_effects",
]

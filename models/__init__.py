"""Models: patch encoders, attention variants and the transformers built from them.

Public API (see docs/api.md):
  build_attention(name, dim, heads, **options)  -> nn.Module, forward(x, mask=None)
  build_model(preset, attention=..., in_dim=..., num_classes=..., **overrides) -> nn.Module
  build_encoder(name, weights=..., random_init=...) -> Encoder
"""

from models.attention import available_attention, build_attention
from models.encoders import available_encoders, build_encoder
from models.presets import available_presets, build_model

__all__ = [
    "available_attention",
    "available_encoders",
    "available_presets",
    "build_attention",
    "build_encoder",
    "build_model",
]

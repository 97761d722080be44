"""Slide-level foundation encoders: one bag of tile features -> one slide embedding.

Each encoder is its own module (feather.py, chief.py), rebuilt from its authors' published code (cited
there) and registered in `SLIDE_ENCODERS`; weights are read as tensors only and checked key by key.

Public API:
  build_slide_encoder(name, *, weights=None, random_init=False) -> SlideEncoder (eval mode)
  SlideEncoder.encode(feats (N, D), coords_um (N, 2) | None, tile_um) -> (dim,) float32
  SlideEncoder.SPEC: SlideEncoderSpec (tile encoder, tile size and mpp, widths, params, licence, ...)
  SLIDE_ENCODERS (registry), get_spec(name), count_parameters(name) (meta device, nothing allocated)
"""

from wsi.models.slide_encoders.base import (
    CHUNK_TILES,
    SLIDE_ENCODERS,
    SlideEncoder,
    SlideEncoderSpec,
    build_slide_encoder,
    count_parameters,
    get_spec,
    streaming_attention_pool,
)

__all__ = [
    "CHUNK_TILES",
    "SLIDE_ENCODERS",
    "SlideEncoder",
    "SlideEncoderSpec",
    "build_slide_encoder",
    "count_parameters",
    "get_spec",
    "streaming_attention_pool",
]

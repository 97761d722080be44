"""Slide-level foundation encoders: one bag of tile features -> one slide embedding.

Each encoder is its own module (feather.py, chief.py), rebuilt from its authors' published code (cited
there) and registered in `SLIDE_ENCODERS`; weights are read as tensors only and checked key by key.

Public API:
  build_slide_encoder(name, *, weights=None, random_init=False) -> SlideEncoder (eval mode)
  SlideEncoder.encode(feats (N, D), coords_um (N, 2) | None, tile_um) -> (dim,) float32
  SlideEncoder.SPEC: SlideEncoderSpec (tile encoder, tile size and mpp, widths, params, licence, ...)
  SLIDE_ENCODERS (registry), get_spec(name), count_parameters(name) (meta device, nothing allocated)
  list_slide_encoders() -> the names, from names.py's table

Importing the package imports no torch: each name loads its module on first use, and
`list_slide_encoders` reads names.py's table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wsi.core.lazy import lazy_exports
from wsi.models.slide_encoders.names import list_slide_encoders

if TYPE_CHECKING:
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
else:
    __getattr__, __dir__ = lazy_exports(__name__, {
        "wsi.models.slide_encoders.base": (
            "CHUNK_TILES", "SLIDE_ENCODERS", "SlideEncoder", "SlideEncoderSpec", "build_slide_encoder",
            "count_parameters", "get_spec", "streaming_attention_pool",
        ),
    })  # fmt: skip

__all__ = [
    "CHUNK_TILES",
    "SLIDE_ENCODERS",
    "SlideEncoder",
    "SlideEncoderSpec",
    "build_slide_encoder",
    "count_parameters",
    "get_spec",
    "list_slide_encoders",
    "streaming_attention_pool",
]

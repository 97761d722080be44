"""Text towers of the pathology vision-language models: prompts -> vectors in the joint image-text space.

Each tower is rebuilt from its authors' code (cited there) and registered in `TEXT_ENCODERS`: coca.py
(CONCH v1, TITAN), clip.py (PLIP), biogpt.py (PRISM); text_tokens.py runs the tokenizers as the authors
do. Weights are read as tensors only and checked key by key in the authors' layout.

  build_text_encoder(name, *, weights=None, random_init=False, tokenizer=None) -> TextTower (eval mode)
  TextTower.encode_text(prompts, normalize=True) -> (P, dim); .image_to_joint(feats) -> (N, dim) unit
      rows; .logit_scale() (the authors' softmax temperature); .image_dim(); .SPEC: TextTowerSpec
  TEXT_ENCODERS (registry), get_spec(name); list_text_encoders() -> the names, from names.py's table

Importing the package imports no torch: each name loads its module on first use, and
`list_text_encoders` reads names.py's table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wsi.core.lazy import lazy_exports
from wsi.models.text_encoders.names import list_text_encoders

if TYPE_CHECKING:
    from wsi.models.text_encoders.base import (
        TEXT_ENCODERS,
        TextTower,
        TextTowerSpec,
        build_text_encoder,
        get_spec,
    )
else:
    __getattr__, __dir__ = lazy_exports(__name__, {
        "wsi.models.text_encoders.base": (
            "TEXT_ENCODERS", "TextTower", "TextTowerSpec", "build_text_encoder", "get_spec",
        ),
    })  # fmt: skip

__all__ = [
    "TEXT_ENCODERS",
    "TextTower",
    "TextTowerSpec",
    "build_text_encoder",
    "get_spec",
    "list_text_encoders",
]

"""Text towers of the pathology vision-language models: prompts -> vectors in the joint image-text space.

Each tower is its own module, rebuilt from its authors' released code (cited there) and registered in
`TEXT_ENCODERS`: coca.py (CONCH v1 and TITAN), clip.py (PLIP), biogpt.py (PRISM); text_tokens.py holds
the tokenizers, run as the authors run them. Weights are read as tensors only and checked key by key in
the authors' layout; tokenizer files come from the model folder, --tokenizer or the Hugging Face cache.

Public API:
  build_text_encoder(name, *, weights=None, random_init=False, tokenizer=None) -> TextTower (eval mode)
  TextTower.encode_text(prompts, normalize=True) -> (P, dim); .image_to_joint(feats) -> (N, dim) unit rows;
      .logit_scale() -> float (the authors' softmax temperature); .image_dim() -> int (stored width it maps);
      .SPEC: TextTowerSpec
  TEXT_ENCODERS (registry), get_spec(name)
"""

from wsi.models.text_encoders.base import (
    TEXT_ENCODERS,
    TextTower,
    TextTowerSpec,
    build_text_encoder,
    get_spec,
)

__all__ = ["TEXT_ENCODERS", "TextTower", "TextTowerSpec", "build_text_encoder", "get_spec"]

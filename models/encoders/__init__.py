"""Tile encoders chosen by name, rebuilt exactly from their authors' recipes, with safe weight loading.

Preprocessing (resize, crop, mean, std) travels with the encoder, so the embed stage hands every encoder
the same uint8 tiles. Weights are only ever read as tensors (`torch.load(weights_only=True)` or
safetensors): a checkpoint is an untrusted file and must not be able to run code.

  build_encoder(name, *, weights, random_init, expected_sha256, input_px, arch_overrides) -> Encoder
  Encoder(nn.Module): .encoder_id, .dim, .weights_sha256, .input_px; preprocess(uint8 (B,H,W,3)) ->
      normalised (B,3,S,S), forward -> (B, dim), embed = forward(preprocess), check_mpp, provenance()
  EncoderRecipe (.digest()), ENCODERS, get_recipe, load_recipe_yaml, list_encoders, encoder_id_for,
  count_parameters, pick_batch_size, load_state_dict_file, RETCCL_SHA256, CTRANSPATH_SHA256

Importing the package imports no torch: each name loads its module on first use (`list_encoders` needs
none: the recipes are plain data).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wsi.core.lazy import lazy_exports

if TYPE_CHECKING:
    from wsi.models.encoders.build import build_encoder, count_parameters
    from wsi.models.encoders.encoder import Encoder, encoder_id_for, mpp_warning, pick_batch_size
    from wsi.models.encoders.named import CTRANSPATH_SHA256, RETCCL_SHA256
    from wsi.models.encoders.recipe import (
        ENCODERS,
        EncoderRecipe,
        available_encoders,
        get_recipe,
        list_encoders,
        load_recipe_yaml,
    )
    from wsi.models.encoders.weights import load_state_dict_file
else:
    __getattr__, __dir__ = lazy_exports(__name__, {
        "wsi.models.encoders.build": ("build_encoder", "count_parameters"),
        "wsi.models.encoders.encoder": ("Encoder", "encoder_id_for", "mpp_warning", "pick_batch_size"),
        "wsi.models.encoders.named": ("CTRANSPATH_SHA256", "RETCCL_SHA256"),
        "wsi.models.encoders.recipe": (
            "ENCODERS", "EncoderRecipe", "available_encoders", "get_recipe", "list_encoders",
            "load_recipe_yaml",
        ),
        "wsi.models.encoders.weights": ("load_state_dict_file",),
    })  # fmt: skip

__all__ = [
    "CTRANSPATH_SHA256",
    "ENCODERS",
    "RETCCL_SHA256",
    "Encoder",
    "EncoderRecipe",
    "available_encoders",
    "build_encoder",
    "count_parameters",
    "encoder_id_for",
    "get_recipe",
    "list_encoders",
    "load_recipe_yaml",
    "load_state_dict_file",
    "mpp_warning",
    "pick_batch_size",
]

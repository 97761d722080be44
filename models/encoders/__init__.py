"""Tile encoders chosen by name, rebuilt exactly from their authors' recipes, with safe weight loading.

Preprocessing (resize, crop, mean, std) travels with the encoder, so the embed stage hands every encoder
the same uint8 tiles. Weights are only ever read as tensors (`torch.load(weights_only=True)` or
safetensors): a checkpoint is an untrusted file and must not be able to run code.

Public API:
  build_encoder(name, *, weights=None, random_init=False, expected_sha256=None, input_px=None,
                arch_overrides=None) -> Encoder
      name: a named encoder (ENCODERS: retccl, uni, uni2-h, virchow2, h-optimus-0, h-optimus-1,
            prov-gigapath, ctranspath, phikon-v2, conch-v1.5), "timm:<architecture>" (any timm model,
            classifier removed), or a recipe file "my-encoder.yaml" (the fields of EncoderRecipe)
      weights: a .pth/.pt/.bin state dict (optionally wrapped in {"state_dict"|"model": ...}, keys
            optionally prefixed "module.") or .safetensors file, or the model folder as the authors'
            hub repository lays it out (config.json + model.safetensors / pytorch_model.bin)
      random_init: build without weights (tests, demo): loud warning, seeded, weights_sha256 = "random"
      expected_sha256: refuse a weights file whose digest differs (published digests warn by default)
      input_px: network input side for timm:<name> encoders; named recipes fix theirs
      arch_overrides: tests/benchmarks only ({"depth": 2}); the name gets an "@test" suffix
  Encoder(nn.Module): .name, .encoder_id, .dim, .weights_sha256, .input_px, .resize_px, .mean, .std,
      .recipe, .backbone, .pool
      preprocess(x (B,H,W,3) uint8 on any device) -> (B,3,S,S) float normalised (resize, crop there)
      forward(x (B,3,S,S) float) -> (B,dim);   embed(x uint8) = forward(preprocess(x))
      check_mpp(tile_mpp) -> warning text | None (logged) when >2x from the training resolution
      provenance() -> dict for the bag;  inference_fn(device, compile=False) -> embed function
  EncoderRecipe (.digest(): sha256 of the fields that decide the features; provenance() carries it as
      recipe_sha256), ENCODERS (registry of named recipes), get_recipe(name), load_recipe_yaml(path)
  available_encoders() -> list[str];  encoder_id_for(name) -> str ("timm:x" -> "timm-x")
  count_parameters(name) -> int (built on the meta device);  pick_batch_size(encoder, device, ...)
  load_state_dict_file(path) -> dict[str, Tensor];  RETCCL_SHA256, CTRANSPATH_SHA256
Errors: WeightsError (missing, unsafe, wrong keys/shapes, digest), ConfigError (unknown name, bad recipe).
"""

from wsi.models.encoders.encoder import (
    Encoder,
    build_encoder,
    count_parameters,
    encoder_id_for,
    mpp_warning,
    pick_batch_size,
)
from wsi.models.encoders.named import CTRANSPATH_SHA256, RETCCL_SHA256
from wsi.models.encoders.recipe import (
    ENCODERS,
    EncoderRecipe,
    available_encoders,
    get_recipe,
    load_recipe_yaml,
)
from wsi.models.encoders.weights import load_state_dict_file

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
    "load_recipe_yaml",
    "load_state_dict_file",
    "mpp_warning",
    "pick_batch_size",
]

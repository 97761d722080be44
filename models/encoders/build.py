"""Building an encoder by name: from its recipe and the authors' weights, or (explicitly) random.

Weights are resolved (a file, a model folder, hf:ORG/REPO or the Hugging Face cache, offline), read as
tensors only, checked key by key against the architecture built on the meta device, and their sha256
recorded (a published digest only warns when it differs; `expected_sha256` refuses). A giant is built
without initialising what its weights overwrite.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from wsi.core.errors import ConfigError, WeightsError
from wsi.core.files import sha256_file
from wsi.models.encoders.encoder import Encoder, build_backbone
from wsi.models.encoders.recipe import EncoderRecipe, get_recipe, is_recipe_path
from wsi.models.encoders.weights import (
    load_checked,
    load_state_dict_file,
    located_weights,
    resolve_weights_path,
)

log = logging.getLogger("wsi.models.encoders")

RANDOM_SEED = 0  # random_init is seeded so that every dask worker builds the same network


def build_encoder(
    name: str,
    *,
    weights: str | os.PathLike[str] | None = None,
    random_init: bool = False,
    expected_sha256: str | None = None,
    input_px: int | None = None,
    arch_overrides: Mapping[str, Any] | None = None,
) -> Encoder:
    """Build an encoder in eval mode on the CPU, with weights from a file or folder, or (explicitly) random.

    name: a named encoder (`wsi encoders`), "timm:<architecture>" (any timm model, classifier removed), or
        a recipe file "my-encoder.yaml" (the fields of EncoderRecipe).
    weights: a .pth/.pt/.bin state dict (optionally wrapped in {"state_dict"|"model": ...}, keys optionally
        prefixed "module.") or .safetensors file, the model folder as the authors' hub repository lays it
        out, `hf:ORG/REPO`, or None (a Hub model is then found in the Hugging Face cache, offline).
    random_init: build without weights (tests, demos): loud warning, seeded, weights_sha256 = "random".
    expected_sha256: refuse a weights file whose digest differs (a published digest only warns).
    input_px: network input side for timm:<name> encoders; named recipes fix theirs.
    arch_overrides: for tests and benchmarks only (e.g. {"depth": 2}): the architecture changes, so the
        encoder's name and id get an "@test" suffix and its bags can never pass for the published model.
    Errors: WeightsError (missing, unsafe, wrong keys or shapes, digest), ConfigError (name, recipe, size).
    """
    if weights is not None and random_init:
        raise WeightsError("give either weights or random_init, not both")
    recipe = get_recipe(name)
    weights = None if random_init else _weights_for(name, recipe, weights)
    _check_input_px(name, recipe, input_px)
    if arch_overrides:
        name = f"{name}@test"
    if is_recipe_path(name) and recipe.dim:
        check_declared_width(recipe, name, arch_overrides)
    input_px = input_px or recipe.input_px
    if weights is None:
        return _random_encoder(recipe, name, input_px, arch_overrides)
    with torch.device("meta"):  # the architecture without memory: its facts, then storage for the load
        skeleton = build_backbone(recipe, arch_overrides)
    path = resolve_weights_path(weights, recipe, name, arch_facts(skeleton))
    state = load_state_dict_file(path)
    digest = _checked_digest(path, name, recipe, expected_sha256)
    enc = Encoder(
        recipe, _materialise(skeleton, recipe, arch_overrides), name=name, weights_sha256=digest,
        input_px=input_px,
    )  # fmt: skip
    load_checked(enc, state, recipe, path, name)
    return enc.eval()


def _weights_for(
    name: str, recipe: EncoderRecipe, weights: str | os.PathLike[str] | None
) -> str | os.PathLike[str]:
    """The weights to load: hf:ORG/REPO, a URL, or nothing for a Hub model are found offline
    (wsi.storage.hf); an encoder left without weights is refused, naming --weights and --random-init."""
    found = located_weights(weights, recipe, name)
    if found is None:
        raise WeightsError(
            f"encoder {name!r} needs weights: give --weights PATH (the weights file or the model folder as "
            "the authors publish it; see `wsi encoders`), or --random-init for tests and demos"
        )
    return found


def _check_input_px(name: str, recipe: EncoderRecipe, input_px: int | None) -> None:
    """ConfigError for an input side the recipe fixes otherwise, or one too small for any network."""
    if input_px is None or input_px == recipe.input_px:
        return
    if recipe.fixed_input_px:
        raise ConfigError(f"encoder {name!r} takes {recipe.input_px} px input; its input size is fixed")
    if input_px < 16:
        raise ConfigError(f"input_px {input_px} is too small for a CNN/ViT encoder")


def _random_encoder(
    recipe: EncoderRecipe, name: str, input_px: int, arch_overrides: Mapping[str, Any] | None
) -> Encoder:
    """The architecture with seeded random weights (the global RNG untouched), with a loud warning."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_SEED)
        backbone = build_backbone(recipe, arch_overrides)
        enc = Encoder(recipe, backbone, name=name, weights_sha256="random", input_px=input_px)
    log.warning(
        "encoder %r has RANDOM weights (random_init): its features carry no pathology knowledge; "
        "use this only for tests and demos",
        name,
    )
    return enc.eval()


def _checked_digest(path: Path, name: str, recipe: EncoderRecipe, expected_sha256: str | None) -> str:
    """The weights file's sha256: refused when it is not `expected_sha256`; a warning when no digest is
    expected and the file is not the published checkpoint (its features will differ from published ones)."""
    digest = sha256_file(path)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise WeightsError(f"{path} has sha256 {digest}, expected {expected_sha256}; wrong or damaged file")
    published = recipe.published_sha256
    if expected_sha256 is None and published and digest != published:
        log.warning(
            "%s is not the published %s checkpoint (sha256 %s..., published %s...); its features will "
            "differ from published %s features",
            path, name, digest[:12], published[:12], name,
        )  # fmt: skip
    return digest


def check_declared_width(
    recipe: EncoderRecipe, name: str, overrides: Mapping[str, Any] | None = None
) -> None:
    """ConfigError when a recipe's `dim` is not the width its model gives: one forward on the meta device
    (shapes only, no memory). Bags and models would otherwise record a width the features do not have."""
    with torch.device("meta"):
        enc = Encoder(
            recipe, build_backbone(recipe, overrides), name=name, weights_sha256="", input_px=recipe.input_px
        )
        try:
            width = int(enc.eval()(torch.empty(2, 3, recipe.input_px, recipe.input_px)).shape[-1])
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"encoder {name!r}: the model does not run on {recipe.input_px} px input ({exc})"
            ) from None
    if width != recipe.dim:
        raise ConfigError(
            f"encoder {name!r} declares dim {recipe.dim}, but its model gives {width}-d features "
            f"(pooling {recipe.pooling!r}); set dim: {width} or fix the architecture arguments"
        )


def arch_facts(backbone: nn.Module) -> dict[str, int]:
    """Width, depth, patch, heads and registers of a ViT (what a hub folder's config.json states)."""
    facts: dict[str, int] = {}
    blocks = getattr(backbone, "blocks", None)
    if isinstance(blocks, nn.Sequential | nn.ModuleList) and len(blocks):
        facts["depth"] = len(blocks)
        heads = getattr(getattr(blocks[0], "attn", None), "num_heads", None)
        if isinstance(heads, int):
            facts["num_heads"] = heads
    for key, attr in (("embed_dim", "embed_dim"), ("reg_tokens", "num_reg_tokens")):
        if isinstance(getattr(backbone, attr, None), int):
            facts[key] = getattr(backbone, attr)
    patch = getattr(getattr(backbone, "patch_embed", None), "patch_size", None)
    if isinstance(patch, tuple) and patch and isinstance(patch[0], int):
        facts["patch_size"] = patch[0]
    return facts


def _materialise(
    skeleton: nn.Module, recipe: EncoderRecipe, overrides: Mapping[str, Any] | None
) -> nn.Module:
    """Storage for a meta-built backbone without initialising it: every persistent tensor is loaded next.

    A giant's random initialisation costs half a minute on a CPU for numbers that are overwritten at once.
    Buffers a module derives itself and does not save (Swin's attention masks) would stay garbage, so such
    architectures are built the ordinary way.
    """
    saved = set(skeleton.state_dict())
    if any(name not in saved for name, _ in skeleton.named_buffers()):
        return build_backbone(recipe, overrides)
    return skeleton.to_empty(device="cpu")


def count_parameters(name: str, overrides: Mapping[str, Any] | None = None) -> int:
    """Parameters of an encoder's architecture, built on the meta device (no memory, no init time)."""
    recipe = get_recipe(name)
    with torch.device("meta"):
        backbone = build_backbone(recipe, overrides)
        enc = Encoder(recipe, backbone, name=name, weights_sha256="random", input_px=recipe.input_px)
    return sum(p.numel() for p in enc.parameters())


__all__ = ["RANDOM_SEED", "arch_facts", "build_encoder", "check_declared_width", "count_parameters"]

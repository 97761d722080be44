"""An encoder built from its recipe: uint8 tiles in, one feature vector per tile out, on any device.

The embed stage decodes each tile once and hands the same (B, H, W, 3) uint8 batch to every encoder;
`Encoder.preprocess` does that encoder's resize, centre crop and normalisation on the device, so several
encoders with different inputs can share one decode.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict, cast

import torch
import torch.nn.functional as F
from torch import nn

from wsi.core.errors import ConfigError, WeightsError
from wsi.core.files import sha256_file
from wsi.core.json_types import JsonObject
from wsi.models.encoders.layers import POOLINGS
from wsi.models.encoders.recipe import EncoderRecipe, get_recipe, is_recipe_path, timm_kwargs
from wsi.models.encoders.weights import (
    load_checked,
    load_state_dict_file,
    located_weights,
    resolve_weights_path,
)

log = logging.getLogger("wsi.models.encoders")

RANDOM_SEED = 0  # random_init is seeded so that every dask worker builds the same network


def encoder_id_for(name: str) -> str:
    """A folder name for bags: "retccl", "timm:vit_small_patch16_224" -> "timm-vit_small_patch16_224".

    A recipe file gives its stem ("recipes/my-encoder.yaml" -> "my-encoder").
    """
    name, _, tag = name.partition("@")  # "uni@test": an architecture changed for tests
    if is_recipe_path(name):
        name = Path(name).stem
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name.replace(":", "-")).strip("-.")
    return f"{safe}-{tag}" if tag else safe


def build_backbone(recipe: EncoderRecipe, overrides: Mapping[str, Any] | None = None) -> nn.Module:
    """The recipe's timm model without a classifier (on the current default device: `meta` counts params)."""
    import timm

    try:
        return timm.create_model(
            recipe.arch, pretrained=False, num_classes=0, **timm_kwargs(recipe, overrides)
        )
    except RuntimeError as exc:  # timm: "Unknown model (...)"
        if "Unknown model" in str(exc):
            raise ConfigError(f"timm has no architecture {recipe.arch!r}; see timm.list_models()") from None
        raise
    except TypeError as exc:  # an argument the architecture does not take
        raise ConfigError(f"timm architecture {recipe.arch!r} refused its arguments ({exc})") from None


def use_fused_attention(module: nn.Module) -> int:
    """Switch every timm attention layer to F.scaled_dot_product_attention; returns how many there are.

    timm decides per layer at construction (TIMM_FUSED_ATTN, and Swin keeps it off as experimental);
    the fused kernel computes the same softmax attention with flash / memory-efficient kernels on a GPU.
    """
    n = 0
    for m in module.modules():
        if hasattr(m, "fused_attn"):
            cast(Any, m).fused_attn = True
            n += 1
    return n


class EncoderProvenance(TypedDict):
    """What a bag records about its encoder (BagProvenance fields, under these names)."""

    encoder: str  # the name it was asked by (retccl, timm:resnet18, a recipe file)
    encoder_id: str  # folder-safe name
    weights_sha256: str
    input_px: int
    dim: int
    recipe: JsonObject  # EncoderRecipe.as_dict()
    recipe_sha256: str


class Encoder(nn.Module):
    """A backbone, its pooling head and its preprocessing; `embed(uint8 tiles) -> (B, dim)` features."""

    _scale: torch.Tensor  # (1, 3, 1, 1) buffers: 1 / (255 std) and -mean / std
    _shift: torch.Tensor

    def __init__(
        self, recipe: EncoderRecipe, backbone: nn.Module, *, name: str, weights_sha256: str, input_px: int
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.pool = POOLINGS.get(recipe.pooling)(
            backbone, recipe.dim or int(cast(Any, backbone).num_features)
        )
        self.recipe = recipe
        self.name = name
        self.encoder_id = encoder_id_for(name)
        self.weights_sha256 = weights_sha256
        self.input_px = input_px
        self.resize_px = recipe.resize_to if input_px == recipe.input_px else input_px
        self.interpolation = recipe.interpolation
        self.mean = recipe.mean
        self.std = recipe.std
        self.dim = recipe.dim or int(cast(Any, backbone).num_features)
        self.fused_attention_layers = use_fused_attention(backbone)
        # (1, 3, 1, 1) scale/shift so normalisation is one fused multiply-add on the device
        std_t = torch.tensor(recipe.std, dtype=torch.float32).view(1, 3, 1, 1)
        mean_t = torch.tensor(recipe.mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.register_buffer("_scale", 1.0 / (255.0 * std_t), persistent=False)
        self.register_buffer("_shift", -mean_t / std_t, persistent=False)

    def preprocess(self, tiles: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 RGB -> (B, 3, S, S) float32 normalised, on the tiles' device.

        torchvision's Resize(resize_px) + CenterCrop(input_px) + ToTensor + Normalize, as the authors run
        it on PIL images: antialiased resize of the shorter side, rounded to uint8 levels, centre crop.
        """
        x = tiles.permute(0, 3, 1, 2).float()  # (B, 3, H, W); the permuted view is channels_last
        h, w = x.shape[-2:]
        if min(h, w) != self.resize_px:
            short = self.resize_px
            size = (short, int(short * w / h)) if h <= w else (int(short * h / w), short)
            # two separable passes, each rounded to uint8 levels, as PIL and torchvision's uint8 kernels
            # resize (width first): within one grey level of them even on noise (two, for about one
            # value in 10^7 of noise), where one 2D pass with a single rounding differs by up to 23
            # levels after bicubic overshoot
            for pass_size in ((h, size[1]), size):
                x = F.interpolate(
                    x, size=pass_size, mode=self.interpolation, antialias=True, align_corners=False
                )
                x = x.clamp_(0.0, 255.0).round_()
            h, w = size
        if h != self.input_px or w != self.input_px:
            top = round((h - self.input_px) / 2.0)  # torchvision's CenterCrop offsets
            left = round((w - self.input_px) / 2.0)
            x = x[..., top : top + self.input_px, left : left + self.input_px]
        return x * self._scale + self._shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.backbone, x)  # (B, dim)

    def embed(self, tiles: torch.Tensor) -> torch.Tensor:
        return self.forward(self.preprocess(tiles))

    def check_mpp(self, tile_mpp: float, *, factor: float = 2.0) -> str | None:
        """A warning (also logged) when tiles are more than `factor` x away from the training resolution."""
        return mpp_warning(self.recipe, tile_mpp, name=self.name, factor=factor)

    def provenance(self) -> EncoderProvenance:
        """What a bag records about the encoder: enough to rebuild it and to tell two apart."""
        return {
            "encoder": self.name,
            "encoder_id": self.encoder_id,
            "weights_sha256": self.weights_sha256,
            "input_px": self.input_px,
            "dim": self.dim,
            "recipe": self.recipe.as_dict(),
            "recipe_sha256": self.recipe.digest(),
        }

    def inference_fn(
        self, device: torch.device, *, compile: bool = False
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """Move to `device` for inference and return the embed function (channels_last for CNNs on a GPU)."""
        if device.type == "cuda" and self.recipe.channels_last:
            self.to(device)
            self.to(memory_format=torch.channels_last)
        else:
            self.to(device)
        self.eval()
        fn: Callable[[torch.Tensor], torch.Tensor] = self.embed
        if compile:
            fn = torch.compile(self.embed, dynamic=False)
        return fn


def mpp_warning(recipe: EncoderRecipe, tile_mpp: float, *, name: str, factor: float = 2.0) -> str | None:
    """The message (logged as a warning) when tiles are far from the resolution the encoder learned."""
    trained = recipe.training_mpp
    if trained is None or tile_mpp <= 0:
        return None
    ratio = tile_mpp / trained
    if 1 / factor <= ratio <= factor:
        return None
    msg = (
        f"encoder {name!r} was trained on tiles at {trained:g} um/px but these tiles are at "
        f"{tile_mpp:g} um/px ({ratio:.2g}x); its features may be poor: tile at {trained:g} um/px "
        f"(wsi tile --mpp {trained:g})"
    )
    log.warning(msg)
    return msg


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

    name: a named encoder (`wsi encoders`), "timm:<architecture>", or a recipe file "my-encoder.yaml".
    arch_overrides: for tests and benchmarks only (e.g. {"depth": 2}): the architecture changes, so the
        encoder's name and id get an "@test" suffix and its bags can never pass for the published model.
    """
    if weights is not None and random_init:
        raise WeightsError("give either weights or random_init, not both")
    recipe = get_recipe(name)
    if not random_init:  # hf:ORG/REPO, a URL, or nothing for a Hub model: found offline (wsi.storage.hf)
        weights = located_weights(weights, recipe, name)
    if weights is None and not random_init:
        raise WeightsError(
            f"encoder {name!r} needs weights: give --weights PATH (the weights file or the model folder as "
            "the authors publish it; see `wsi encoders`), or --random-init for tests and demos"
        )
    if input_px is not None and input_px != recipe.input_px:
        if recipe.fixed_input_px:
            raise ConfigError(f"encoder {name!r} takes {recipe.input_px} px input; its input size is fixed")
        if input_px < 16:
            raise ConfigError(f"input_px {input_px} is too small for a CNN/ViT encoder")
    if arch_overrides:
        name = f"{name}@test"
    if is_recipe_path(name) and recipe.dim:
        check_declared_width(recipe, name, arch_overrides)
    if weights is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(RANDOM_SEED)
            backbone = build_backbone(recipe, arch_overrides)
            enc = Encoder(
                recipe, backbone, name=name, weights_sha256="random", input_px=input_px or recipe.input_px
            )
        log.warning(
            "encoder %r has RANDOM weights (random_init): its features carry no pathology knowledge; "
            "use this only for tests and demos",
            name,
        )
        return enc.eval()
    with torch.device("meta"):  # the architecture without memory: its facts, then storage for the load
        skeleton = build_backbone(recipe, arch_overrides)
    path = resolve_weights_path(weights, recipe, name, arch_facts(skeleton))
    state = load_state_dict_file(path)
    digest = sha256_file(path)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise WeightsError(f"{path} has sha256 {digest}, expected {expected_sha256}; wrong or damaged file")
    enc = Encoder(
        recipe, _materialise(skeleton, recipe, arch_overrides), name=name, weights_sha256=digest,
        input_px=input_px or recipe.input_px,
    )  # fmt: skip
    load_checked(enc, state, recipe, path, name)
    published = recipe.published_sha256
    if expected_sha256 is None and published and digest != published:
        log.warning(
            "%s is not the published %s checkpoint (sha256 %s..., published %s...); its features will "
            "differ from published %s features",
            path, name, digest[:12], published[:12], name,
        )  # fmt: skip
    return enc.eval()


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


def pick_batch_size(
    encoder: Encoder,
    device: torch.device,
    *,
    tile_px: int | None = None,
    autocast: torch.dtype | None = torch.bfloat16,
    memory_fraction: float = 0.7,
    max_batch: int = 1024,
    cpu_batch: int = 32,
) -> int:
    """Tiles per forward pass that fit in `memory_fraction` of the device's free memory.

    Measured, not guessed: one probe batch of 8 tiles gives the peak memory per tile of this encoder at
    this precision; the batch is the largest multiple of 8 whose peak fits. On a CPU, `cpu_batch`.
    The encoder must already be on `device`.
    """
    if device.type != "cuda":
        return min(cpu_batch, max_batch)
    side = tile_px or encoder.resize_px
    probe = 8
    torch.cuda.synchronize(device)
    free, _total = torch.cuda.mem_get_info(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    tiles = torch.zeros(probe, side, side, 3, dtype=torch.uint8, device=device)
    with (
        torch.inference_mode(),
        torch.autocast("cuda", dtype=autocast or torch.float32, enabled=autocast is not None),
    ):
        encoder.embed(tiles)
    torch.cuda.synchronize(device)
    per_tile = max(1, (torch.cuda.max_memory_allocated(device) - base) // probe)
    del tiles
    fits = int(free * memory_fraction) // per_tile
    batch = max(probe, (fits // 8) * 8) if fits >= probe else max(1, fits)
    log.info("batch size %d for %s on %s (%.1f MB per tile, %.1f GB free)",
             min(batch, max_batch), encoder.name, device, per_tile / 2**20, free / 2**30)  # fmt: skip
    return min(batch, max_batch)


__all__ = [
    "Encoder",
    "build_backbone",
    "build_encoder",
    "check_declared_width",
    "count_parameters",
    "encoder_id_for",
    "mpp_warning",
    "pick_batch_size",
    "use_fused_attention",
]

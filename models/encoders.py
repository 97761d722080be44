"""Tile encoders chosen by name: a registry of small factories plus safe weight loading.

Preprocessing (input size, mean, std) travels with the encoder, so the feed only hands it uint8 tiles.
Weights are only ever read as tensors (`torch.load(weights_only=True)` or safetensors): a checkpoint is
an untrusted file and must not be able to run code.

Public API:
  build_encoder(name, *, weights=None, random_init=False, expected_sha256=None, input_px=None) -> Encoder
      name: "retccl" | "timm:<architecture>" (any timm model; classifier removed)
      weights: a .pth/.pt/.bin (state dict, optionally wrapped in {"state_dict"|"model": ...}, keys
               optionally prefixed "module.") or a .safetensors file
      random_init: build without weights (tests, demo): loud warning, seeded (same numbers in every
               process), weights_sha256 = "random"
      expected_sha256: refuse a weights file whose digest differs (retccl warns against the published
               digest by default)
      input_px: network input side for timm encoders (default: the architecture's own); retccl is
               always 256
  available_encoders() -> list[str]         registered names and prefixes ("timm:<name>")
  register_encoder(name)                    decorator for a factory returning EncoderSpec
  encoder_id_for(name) -> str               path-safe id: "retccl", "timm-resnet18"
  load_state_dict_file(path) -> dict[str, Tensor]   unwrap + strip prefixes, tensors only
  Encoder(nn.Module): .name, .encoder_id, .dim, .weights_sha256, .input_px, .mean, .std
      preprocess(x (B,H,W,3) uint8) -> (B,3,S,S) float normalised (resized when H != input_px)
      forward(x (B,3,S,S) float) -> (B,D);   embed(x uint8) = forward(preprocess(x))
  RETCCL_SHA256                             digest of the published best_ckpt.pth
Errors: WeightsError (missing, unsafe, wrong keys/shapes, digest), ConfigError (unknown name).
"""

from __future__ import annotations

import logging
import os
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from wsi.errors import ConfigError, WeightsError
from wsi.files import sha256_file

log = logging.getLogger(__name__)

RETCCL_SHA256 = "931956f31d3f1a3f6047f3172b9e59ee3460d29f7c0c2bb219cbc8e9207795ff"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RANDOM_SEED = 0  # random_init is seeded so that every dask worker builds the same network


@dataclass(frozen=True)
class EncoderSpec:
    """What a factory returns: the backbone and the preprocessing that belongs to its weights."""

    backbone: nn.Module  # forward (B,3,S,S) -> (B,D)
    dim: int
    input_px: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    classifier_prefixes: tuple[str, ...] = ()  # checkpoint keys to ignore (head removed here)
    published_sha256: str | None = None  # warn when a weights file differs from this
    fixed_input_px: bool = False  # input_px is part of the encoder's contract


_FACTORIES: dict[str, Callable[[], EncoderSpec]] = {}
_PREFIX_FACTORIES: dict[str, Callable[[str], EncoderSpec]] = {}


def register_encoder(name: str, *, prefix: bool = False) -> Callable[[Callable], Callable]:
    """Register a factory by name; with prefix=True it serves "name:<arg>" and receives <arg>."""

    def deco(factory: Callable) -> Callable:
        (_PREFIX_FACTORIES if prefix else _FACTORIES)[name] = factory
        return factory

    return deco


def available_encoders() -> list[str]:
    return sorted(_FACTORIES) + [f"{p}:<name>" for p in sorted(_PREFIX_FACTORIES)]


def _timm_backbone(arch: str, **kwargs: object) -> nn.Module:
    import timm

    try:
        return timm.create_model(arch, pretrained=False, num_classes=0, **kwargs)
    except RuntimeError as exc:  # timm: "Unknown model (...)"
        raise ConfigError(f"timm has no architecture {arch!r} ({exc}); see timm.list_models()") from None


@register_encoder("retccl")
def _retccl() -> EncoderSpec:
    # RetCCL (Wang et al. 2023): a torchvision-layout ResNet-50 whose fc was replaced by Identity. timm's
    # resnet50 uses the same parameter names (conv1, bn1, layer1..4), so the checkpoint loads as is.
    backbone = _timm_backbone("resnet50")
    return EncoderSpec(
        backbone=backbone,
        dim=backbone.num_features,  # 2048, global average pool
        input_px=256,  # RetCCL was trained on 256 px tiles at 1 um/px, no crop
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        classifier_prefixes=("fc.",),
        published_sha256=RETCCL_SHA256,
        fixed_input_px=True,
    )


@register_encoder("timm", prefix=True)
def _timm(arch: str) -> EncoderSpec:
    backbone = _timm_backbone(arch)
    cfg = getattr(backbone, "pretrained_cfg", {}) or {}
    input_px = int(cfg.get("input_size", (3, 224, 224))[-1])
    classifier = cfg.get("classifier") or "fc"
    classifiers = classifier if isinstance(classifier, (list, tuple)) else (classifier,)
    return EncoderSpec(
        backbone=backbone,
        dim=int(backbone.num_features),
        input_px=input_px,
        mean=tuple(cfg.get("mean", IMAGENET_MEAN)),  # type: ignore[arg-type]
        std=tuple(cfg.get("std", IMAGENET_STD)),  # type: ignore[arg-type]
        classifier_prefixes=tuple(f"{c}." for c in classifiers),
    )


def encoder_id_for(name: str) -> str:
    """A folder name for bags: "retccl", "timm:vit_small_patch16_224" -> "timm-vit_small_patch16_224"."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name.replace(":", "-")).strip("-.")


class Encoder(nn.Module):
    """A backbone with its preprocessing; takes uint8 tiles so the host sends 4x fewer bytes."""

    def __init__(self, spec: EncoderSpec, *, name: str, weights_sha256: str, input_px: int) -> None:
        super().__init__()
        self.backbone = spec.backbone
        self.name = name
        self.encoder_id = encoder_id_for(name)
        self.dim = spec.dim
        self.weights_sha256 = weights_sha256
        self.input_px = input_px
        self.mean = spec.mean
        self.std = spec.std
        # (1, 3, 1, 1) scale/shift so normalisation is one fused multiply-add on the device
        std_t = torch.tensor(spec.std, dtype=torch.float32).view(1, 3, 1, 1)
        mean_t = torch.tensor(spec.mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.register_buffer("_scale", 1.0 / (255.0 * std_t), persistent=False)
        self.register_buffer("_shift", -mean_t / std_t, persistent=False)

    def preprocess(self, tiles: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 RGB -> (B, 3, S, S) float32 normalised, channels_last in memory."""
        x = tiles.permute(0, 3, 1, 2).float()  # (B, 3, H, W); the permuted view is channels_last
        if x.shape[-1] != self.input_px or x.shape[-2] != self.input_px:
            x = F.interpolate(
                x, size=(self.input_px, self.input_px), mode="bilinear", antialias=True, align_corners=False
            )
        return x * self._scale + self._shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)  # (B, D)

    def embed(self, tiles: torch.Tensor) -> torch.Tensor:
        return self.forward(self.preprocess(tiles))


# ----------------------------------------------------------------------------------------- weights


def _unwrap(obj: object, path: Path) -> dict[str, torch.Tensor]:
    for _ in range(3):  # {"state_dict": {...}}, {"model": {...}}, {"model": {"state_dict": ...}}
        if isinstance(obj, dict):
            for key in ("state_dict", "model", "model_state_dict", "module"):
                if isinstance(obj.get(key), dict):
                    obj = obj[key]
                    break
            else:
                break
    if not isinstance(obj, dict) or not obj:
        raise WeightsError(f"{path} holds no state dict (found {type(obj).__name__}); give a weights file")
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise WeightsError(f"{path} holds a dict without tensors (keys {list(obj)[:5]}); not a weights file")
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        for prefix in ("module.", "_orig_mod."):  # DataParallel / torch.compile wrappers
            while key.startswith(prefix):
                key = key[len(prefix) :]
        out[key] = value
    return out


def load_state_dict_file(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Tensors from a checkpoint without ever unpickling objects (weights_only / safetensors)."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return _unwrap(load_file(str(path), device="cpu"), path)
        except Exception as exc:  # safetensors raises its own error types
            raise WeightsError(f"{path} is not a readable safetensors file ({exc})") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message is long and coloured; keep only the line naming the refused object
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
        found = [ln.strip() for ln in text.splitlines() if "GLOBAL" in ln]
        if not found:  # not a pickle of objects at all: damaged or some other file
            raise WeightsError(
                f"{path} is not a readable PyTorch checkpoint ({text.strip()[:200]})"
            ) from None
        what = f" ({found[0].split(' was not an allowed')[0]})"
        raise WeightsError(
            f"{path} contains Python objects other than tensors{what}; they are not loaded because "
            "unpickling can run arbitrary code. Save only the state dict: torch.save(model.state_dict(), ...)"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise WeightsError(f"{path} is not a readable PyTorch checkpoint ({exc})") from None
    return _unwrap(obj, path)


def _few(keys: set[str], n: int = 5) -> str:
    items = sorted(keys)
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def _load_into(spec: EncoderSpec, state: dict[str, torch.Tensor], path: Path, name: str) -> None:
    model = spec.backbone
    expected = model.state_dict()
    given = {k: v for k, v in state.items() if not k.startswith(spec.classifier_prefixes)}
    dropped = len(state) - len(given)
    if dropped:
        log.info(
            "%s: ignoring %d classifier tensors (%s)", path, dropped, ", ".join(spec.classifier_prefixes)
        )
    missing = set(expected) - set(given)
    unexpected = set(given) - set(expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing: {_few(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected: {_few(unexpected)}")
        raise WeightsError(
            f"{path} does not fit encoder {name!r} ({'; '.join(parts)}); "
            "is it a checkpoint of this architecture?"
        )
    wrong = {k for k in expected if tuple(given[k].shape) != tuple(expected[k].shape)}
    if wrong:
        k = sorted(wrong)[0]
        raise WeightsError(
            f"{path} has tensors of the wrong shape for encoder {name!r}: {_few(wrong)} "
            f"(e.g. {k}: file {tuple(given[k].shape)}, model {tuple(expected[k].shape)})"
        )
    model.load_state_dict(given, strict=True)


def _resolve(name: str) -> EncoderSpec:
    if name in _FACTORIES:
        return _FACTORIES[name]()
    prefix, sep, arg = name.partition(":")
    if sep and prefix in _PREFIX_FACTORIES and arg:
        return _PREFIX_FACTORIES[prefix](arg)
    raise ConfigError(f"unknown encoder {name!r}; choose one of {', '.join(available_encoders())}")


def build_encoder(
    name: str,
    *,
    weights: str | os.PathLike[str] | None = None,
    random_init: bool = False,
    expected_sha256: str | None = None,
    input_px: int | None = None,
) -> Encoder:
    """Build an encoder in eval mode on the CPU, with weights from a file or (explicitly) random ones."""
    if weights is None and not random_init:
        raise WeightsError(
            f"encoder {name!r} needs weights: give --weights PATH (for retccl the published best_ckpt.pth), "
            "or --random-init for tests and demos (features are then meaningless)"
        )
    if weights is not None and random_init:
        raise WeightsError("give either weights or random_init, not both")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_SEED)
        spec = _resolve(name)
    if input_px is not None and input_px != spec.input_px:
        if spec.fixed_input_px:
            raise ConfigError(f"encoder {name!r} takes {spec.input_px} px input; its input size is fixed")
        if input_px < 16:
            raise ConfigError(f"input_px {input_px} is too small for a CNN/ViT encoder")
    if weights is None:
        msg = (
            f"encoder {name!r} has RANDOM weights (random_init): its features carry no pathology "
            "knowledge; use this only for tests and demos"
        )
        log.warning(msg)
        digest = "random"
    else:
        path = Path(weights)
        state = load_state_dict_file(path)
        digest = sha256_file(path)
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise WeightsError(
                f"{path} has sha256 {digest}, expected {expected_sha256}; wrong or damaged file"
            )
        _load_into(spec, state, path, name)
        if expected_sha256 is None and spec.published_sha256 and digest != spec.published_sha256:
            log.warning(
                "%s is not the published %s checkpoint (sha256 %s..., published %s...); its features will "
                "differ from published %s features",
                path, name, digest[:12], spec.published_sha256[:12], name,
            )  # fmt: skip
    enc = Encoder(spec, name=name, weights_sha256=digest, input_px=input_px or spec.input_px)
    return enc.eval()

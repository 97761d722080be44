"""The published recipe of every named tile encoder, as its authors' code and model cards give it:
the reference tests/models/encoders/test_encoder_recipes.py checks `build_encoder` against (kept apart: it is
data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HOPTIMUS = ((0.707223, 0.578729, 0.703617), (0.211883, 0.230117, 0.177517))


@dataclass(frozen=True)
class Published:
    """A ViT as its authors describe it (numbers typed in from the model cards, not read from our code)."""

    width: int
    heads: int
    patch: int
    hidden: int  # fc1 output features (SwiGLU-packed: gate and value halves)
    swiglu: bool
    reg: int  # register tokens
    pos_prefix: int  # prefix tokens that have position embeddings (0: no_embed_class)
    pooling: Literal["cls", "cls+mean", "attn-pool"]
    layout: Literal["timm", "hf-dinov2", "conch"]
    norm: tuple[tuple[float, float, float], tuple[float, float, float]]
    resize: int
    crop: int
    bicubic: bool
    file: str
    grid_in_file: int  # position table side stored in the checkpoint
    params: float  # the published parameter count


PUBLISHED = {
    "uni": Published(
        1024,
        16,
        16,
        4096,
        False,
        0,
        1,
        "cls",
        "timm",
        IMAGENET,
        224,
        224,
        False,
        "pytorch_model.bin",
        14,
        303e6,
    ),
    "uni2-h": Published(
        1536,
        24,
        14,
        8192,
        True,
        8,
        0,
        "cls",
        "timm",
        IMAGENET,
        224,
        224,
        False,
        "pytorch_model.bin",
        16,
        681e6,
    ),
    "virchow": Published(  # paige-ai/Virchow config (virchow_v1); the paper's 632M parameters
        1280,
        16,
        14,
        6832,
        True,
        0,
        1,
        "cls+mean",
        "timm",
        IMAGENET,
        224,
        224,
        True,
        "pytorch_model.bin",
        16,
        632e6,
    ),
    "virchow2": Published(
        1280,
        16,
        14,
        6832,
        True,
        4,
        5,
        "cls+mean",
        "timm",
        IMAGENET,
        224,
        224,
        True,
        "model.safetensors",
        16,
        632e6,
    ),
    "h-optimus-0": Published(
        1536,
        24,
        14,
        8192,
        True,
        4,
        0,
        "cls",
        "timm",
        HOPTIMUS,
        224,
        224,
        False,
        "model.safetensors",
        16,
        1.13e9,
    ),
    "h-optimus-1": Published(
        1536,
        24,
        14,
        8192,
        True,
        4,
        0,
        "cls",
        "timm",
        HOPTIMUS,
        224,
        224,
        False,
        "pytorch_model.bin",
        16,
        1.13e9,
    ),
    "prov-gigapath": Published(
        1536,
        24,
        16,
        8192,
        True,
        0,
        1,
        "cls",
        "timm",
        IMAGENET,
        256,
        224,
        True,
        "pytorch_model.bin",
        14,
        1.13e9,
    ),
    "phikon-v2": Published(
        1024,
        16,
        16,
        4096,
        False,
        0,
        1,
        "cls",
        "hf-dinov2",
        IMAGENET,
        224,
        224,
        False,
        "model.safetensors",
        14,
        303e6,
    ),
    "conch-v1.5": Published(
        1024,
        16,
        16,
        4096,
        False,
        0,
        1,
        "attn-pool",
        "conch",
        IMAGENET,
        448,
        448,
        False,
        "pytorch_model_vision.bin",
        14,
        307e6,
    ),
}

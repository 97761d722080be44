"""What an encoder is, as data: the architecture, the preprocessing of its weights and its output.

A recipe is everything needed to rebuild an encoder exactly from a weights file: the timm architecture and
its arguments, how a tile becomes the network input (resize, centre crop, mean and std), how the token
sequence becomes one vector, how the authors' checkpoint names its tensors, and the facts a user needs to
choose and cite it (width, parameters, training resolution, licence). Named recipes register themselves in
`ENCODERS` (models/encoders/named.py); a user's own encoder is the same recipe read from YAML.

Layer arguments (`mlp_layer`, `act_layer`, `embed_layer`, `norm_layer`) are written as names from `LAYERS`,
so every recipe, named or YAML, is plain data that `wsi encoders` can print and a bag can record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from wsi.core.config import MAX_MPP, config_dict, config_model, parse_config
from wsi.core.errors import ConfigError
from wsi.core.json_types import JsonObject, JsonValue
from wsi.core.registry import Registry
from wsi.core.renamed import renamed
from wsi.core.user_text import load_yaml_file

if TYPE_CHECKING:
    from torch import nn

_Side = Annotated[int, Field(ge=16, le=4096)]  # a network input side, px
_Unit = Annotated[float, Field(ge=0, le=1)]  # a mean of [0, 1] RGB
_Spread = Annotated[float, Field(gt=0, le=10)]  # a std of [0, 1] RGB
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Pooling = Literal["model", "cls", "cls+mean", "cls-proj", "attn-pool", "mha-pool"]
#: recipe fields that change no feature value (facts for people, where to find files, how to run fast):
#: left out of `EncoderRecipe.digest`, so a licence note edited in a recipe does not re-embed a cohort
DESCRIPTIVE_FIELDS = (
    "params", "training_mpp", "licence", "source", "reference", "published_sha256", "weights_files",
    "channels_last", "fixed_input_px",
)  # fmt: skip


@config_model
@dataclass(frozen=True)
class EncoderRecipe:
    """One encoder, exactly as its authors run it (fields documented beside each)."""

    arch: str  # timm architecture name (timm.create_model), e.g. "vit_large_patch16_224"
    # width of one tile's feature vector after pooling (0: not known until built, timm:<name>)
    dim: Annotated[int, Field(ge=0, le=1 << 20)]
    input_px: _Side  # side of the square network input, after resize and centre crop
    mean: tuple[_Unit, _Unit, _Unit] = IMAGENET_MEAN  # per-channel mean of [0, 1] RGB the weights expect
    std: tuple[_Spread, _Spread, _Spread] = IMAGENET_STD  # per-channel std, same space
    # timm.create_model arguments beyond pretrained/num_classes; *_layer values are names from LAYERS.
    # Free-form: which arguments exist depends on the architecture (timm checks them when building)
    kwargs: JsonObject = field(default_factory=dict)
    # the tile's shorter side is resized to resize_px, then centre-cropped to input_px (torchvision's
    # Resize(resize_px) + CenterCrop(input_px)); None means resize_px = input_px (a plain resize)
    resize_px: _Side | None = None
    interpolation: Literal["bilinear", "bicubic"] = "bilinear"  # the resize filter (antialiased)
    # how tokens become one vector: "model" (the timm model's own head: global average for CNN/Swin),
    # "cls" (class token), "cls+mean" (class token concatenated with the mean of the patch tokens, registers
    # excluded), "attn-pool" (CONCH v1.5's attentional pooler + LayerNorm, weights in the checkpoint),
    # "mha-pool" (CONCH v1's: the same with nn.MultiheadAttention's biases), "cls-proj" (class token times
    # the checkpoint's image projection: a CLIP tower's joint-space embedding, PLIP)
    pooling: Pooling = "model"
    key_layout: str = "timm"  # how the authors' checkpoint names tensors (models/encoders/weights.py)
    # regexes of checkpoint tensors that are not part of the encoder: classifier heads, training-only
    # tokens, buffers the architecture derives itself; they are dropped, and logged, never loaded
    ignore_keys: tuple[str, ...] = ()
    # files to look for, in order, when --weights is a model folder as the authors' hub repository lays it out
    weights_files: tuple[str, ...] = ("model.safetensors", "pytorch_model.bin")
    published_sha256: str | None = None  # digest of the authors' file: a different file loads with a warning
    params: Annotated[int, Field(ge=0, le=10**13)] | None = (
        None  # parameters of the architecture (tests check it against the built model)
    )
    training_mpp: Annotated[float, Field(gt=0, le=MAX_MPP)] | None = (
        None  # um/px of the tiles it was trained on; warn when tiles are >2x away
    )
    licence: str = "unknown"  # the weights' licence, as the authors publish it
    source: str = ""  # where the weights come from (the authors' page)
    reference: str = ""  # the public code this recipe was checked against
    channels_last: bool = False  # a CNN: run in channels_last memory format on the GPU
    fixed_input_px: bool = True  # input_px is part of the recipe (named encoders); timm:<name> may change it

    def __post_init__(self) -> None:
        resize = self.resize_px or self.input_px
        if self.input_px < 16 or resize < self.input_px:
            raise ConfigError(
                f"encoder recipe {self.arch}: input_px {self.input_px} must be >= 16 and resize_px {resize} "
                "at least input_px (the crop is taken from the resized tile)"
            )
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ConfigError(f"encoder recipe {self.arch}: mean and std need 3 values, std > 0")

    @property
    def resize_to(self) -> int:
        return self.resize_px or self.input_px

    def as_dict(self) -> JsonObject:
        """JSON-ready, for `wsi encoders` and the bag's provenance."""
        return config_dict(self)

    def digest(self) -> str:
        """sha256 of the fields that decide the features (not DESCRIPTIVE_FIELDS): the embed stage redoes
        a bag whose recipe digest differs, e.g. a YAML encoder edited under the same name."""
        data = {k: v for k, v in self.as_dict().items() if k not in DESCRIPTIVE_FIELDS}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


# One registry for the named encoders: a small factory per name, registered beside its recipe.
ENCODERS: Registry[Callable[[], EncoderRecipe]] = Registry("encoder", modules=("wsi.models.encoders.named",))


def _layers() -> dict[str, Callable[..., nn.Module]]:
    """Layer names a recipe may use for *_layer arguments (imported lazily: timm is heavy)."""
    from timm.layers import GluMlp, Mlp, SwiGLU, SwiGLUPacked
    from torch import nn

    from wsi.models.encoders.layers import ConvStem

    return {
        "mlp": Mlp,  # fc1 -> act -> fc2
        "swiglu_packed": SwiGLUPacked,  # fc1 packs [gate, value]: fc2(silu(gate) * value)
        "swiglu": SwiGLU,  # separate fc1_g / fc1_x
        "glu_mlp": GluMlp,
        "gelu": nn.GELU,
        "silu": nn.SiLU,
        "relu": nn.ReLU,
        "layernorm": nn.LayerNorm,
        "conv_stem": ConvStem,  # CTransPath's convolutional patch embedding
    }


LAYER_NAMES = (
    "mlp", "swiglu_packed", "swiglu", "glu_mlp", "gelu", "silu", "relu", "layernorm", "conv_stem",
)  # fmt: skip


def timm_kwargs(recipe: EncoderRecipe, overrides: Mapping[str, JsonValue] | None = None) -> dict[str, Any]:
    """The recipe's create_model arguments with layer names resolved to classes (Any: what they may be
    is `timm.create_model`'s and the architecture's business; its signature types them)."""
    table = _layers()
    out: dict[str, Any] = {}
    for key, value in {**recipe.kwargs, **(overrides or {})}.items():
        if key.endswith("_layer") and isinstance(value, str):
            if value not in table:
                raise ConfigError(f"{key}: unknown layer {value!r}; choose one of {', '.join(table)}")
            out[key] = table[value]
        else:
            out[key] = value
    return out


def load_recipe_yaml(path: str | Path) -> EncoderRecipe:
    """A user's encoder from YAML: the fields of EncoderRecipe, validated like every config."""
    path = Path(path)
    data = load_yaml_file(path, what="encoder recipe")  # UTF-8, no aliases, size-capped
    recipe = parse_config(EncoderRecipe, data or {}, source=str(path))
    _refuse_self_loading(recipe, path)
    _refuse_secrets(data or {}, path)
    for key, value in recipe.kwargs.items():
        if key.endswith("_layer") and value not in LAYER_NAMES:
            raise ConfigError(f"{path}: kwargs.{key}: unknown layer {value!r}; choose one of {LAYER_NAMES}")
    return dataclasses.replace(recipe, source=recipe.source or str(path))


def _refuse_secrets(data: Mapping[str, Any], path: Path) -> None:
    """A recipe is stored in every bag it makes (and printed by `wsi encoders`): a value holding a secret
    (a URL's user:password, a signed URL's signature) is refused, named without it."""
    from wsi.storage.urls import redact

    for key, value in _strings(data):
        if redact(value) != value:
            raise ConfigError(
                f"{path}: {key} {redact(value)} holds a secret (a URL's user:password or a signed URL's "
                "signature), which would be stored in every bag made with this recipe; remove it (give "
                "credentials the standard way: environment variables or your tool's credential file)"
            )


def _strings(value: object, where: str = "") -> list[tuple[str, str]]:
    """(dotted place, text) of every string in a YAML value (mappings and lists, at any depth)."""
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, Mapping):
        return [s for k, v in value.items() for s in _strings(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list | tuple):
        return [s for i, v in enumerate(value) for s in _strings(v, f"{where}.{i}")]
    return []


#: timm.create_model arguments that fetch or read weights by themselves (timm/_builder.py, load_checkpoint):
#: a bag's provenance records the sha256 of the --weights file, so nothing else may put numbers in
SELF_LOADING_KWARGS = (
    "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path", "pretrained_strict",
    "cache_dir", "num_classes",
)  # fmt: skip


def _refuse_self_loading(recipe: EncoderRecipe, path: Path) -> None:
    """Refuse a YAML recipe whose architecture or arguments would load weights other than --weights
    (a hub id, a local folder, timm's pretrained download or a checkpoint path)."""
    found = [k for k in recipe.kwargs if k in SELF_LOADING_KWARGS]
    if found:
        raise ConfigError(
            f"{path}: kwargs {', '.join(found)} would make timm load or download weights by itself; the "
            "weights come from --weights only (their sha256 goes into every bag): remove them"
        )
    if ":" in recipe.arch or "/" in recipe.arch:
        raise ConfigError(
            f"{path}: arch {recipe.arch!r} names a hub repository or folder, which timm would fetch; give a "
            "timm architecture name (timm.list_models()) and the weights file with --weights"
        )


def is_recipe_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml"))


def get_recipe(name: str) -> EncoderRecipe:
    """A named recipe, a YAML file's recipe, or "timm:<arch>" (any timm model, its own preprocessing)."""
    if is_recipe_path(name):
        if not Path(name).is_file():
            raise ConfigError(
                f"encoder recipe {name} does not exist; give a YAML file or a name (wsi encoders)"
            )
        return load_recipe_yaml(name)
    prefix, sep, arch = name.partition(":")
    if sep and prefix == "timm":
        if not arch:
            raise ConfigError("give the timm architecture after 'timm:', e.g. timm:resnet50")
        return _timm_recipe(arch)
    if name not in ENCODERS:
        raise ConfigError(
            f"unknown encoder {name!r}; choose one of {', '.join(list_encoders())}, "
            "or give a recipe file (my-encoder.yaml)"
        )
    return ENCODERS.get(name)()


def _timm_recipe(arch: str) -> EncoderRecipe:
    """Any timm model with the preprocessing of its default pretrained config (classifier removed)."""
    import timm

    if not timm.is_model(arch.split(".")[0]):
        raise ConfigError(f"timm has no architecture {arch!r}; see timm.list_models()")
    cfg = timm.get_pretrained_cfg(arch)
    cfg_dict = cfg.to_dict() if cfg is not None else {}
    classifier = cfg_dict.get("classifier") or "fc"
    classifiers = classifier if isinstance(classifier, (list, tuple)) else (classifier,)
    return EncoderRecipe(
        arch=arch,
        dim=0,  # known once built (num_features)
        input_px=int(cfg_dict.get("input_size", (3, 224, 224))[-1]),
        mean=tuple(cfg_dict.get("mean", IMAGENET_MEAN)),
        std=tuple(cfg_dict.get("std", IMAGENET_STD)),
        ignore_keys=tuple(f"^{re.escape(c)}\\." for c in classifiers),
        channels_last=True,
        fixed_input_px=False,
        source="timm",
    )


def list_encoders() -> list[str]:
    """Named encoders, then the open-ended forms."""
    return [*ENCODERS.names(), "timm:<name>", "<recipe>.yaml"]


available_encoders = renamed(list_encoders, "wsi.models.encoders.available_encoders")  # the old name


__all__ = [
    "DESCRIPTIVE_FIELDS",
    "ENCODERS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LAYER_NAMES",
    "EncoderRecipe",
    "available_encoders",
    "get_recipe",
    "is_recipe_path",
    "list_encoders",
    "load_recipe_yaml",
    "timm_kwargs",
]

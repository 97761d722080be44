"""Model presets (configs/models/<preset>.yaml), the model factory, and softmax -> seqnorm transfer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from wsi import configs
from wsi.core.config import parse_config
from wsi.core.errors import ConfigError, WeightsError
from wsi.core.renamed import renamed
from wsi.models.attention import AttentionBase
from wsi.models.base.kinds import MODEL_KINDS, KindModel


def list_models() -> list[str]:
    """Model presets by name (configs/models/), as `build_model(preset, ...)` takes them."""
    return configs.available("models")


available_presets = renamed(list_models, "wsi.models.presets.available_presets")  # the old name


@dataclass(frozen=True)
class Preset:
    """A model preset as read from its YAML (configs/models/<name>.yaml or a path): the one reader."""

    data: dict[str, Any]  # the preset's fields (a model kind's config, `kind` defaulting to mil)
    source: str  # where it was read from, for messages

    @property
    def kind(self) -> str:
        """The model kind it builds (`mil`, `abmil`, `vit2d`, ...)."""
        return str(self.data.get("kind", "mil"))

    @property
    def attention(self) -> str | None:
        """The attention it names (its own default), or None."""
        value = self.data.get("attention")
        return None if value is None else str(value)


def load_preset(preset: str | Path) -> Preset:
    """A packaged preset by name, a YAML path or URL (its local copy), parsed once per file version
    (`wsi.configs`)."""
    from wsi.storage import is_url, local_file

    if is_url(str(preset)):
        preset = local_file(str(preset), what="preset file")
    data, source = configs.load_yaml("models", preset)
    return Preset(dict(data), source)


def build_model(
    preset: str | Path,
    *,
    attention: str | None = None,
    in_dim: int | None = None,
    num_classes: int | None = None,
    **overrides: Any,
) -> KindModel:
    """Model of a preset (packaged name or YAML path); arguments left None keep the preset's value.

    `in_dim` is the input width the data gives: the feature width for models over bags (`mil`,
    `abmil`: their config's `in_dim`), the number of input channels for the ViTs (`in_channels`).
    """
    found = load_preset(preset)
    data, source = found.data, found.source
    if attention is not None:
        data["attention"] = attention
    if num_classes is not None:
        data["num_classes"] = num_classes
    if in_dim is not None:
        data[input_width_field(str(data.get("kind", "mil")))] = in_dim
    data.update(overrides)
    try:
        return build_model_from_config(data, source=source)
    except ConfigError as exc:
        if attention is None or "unknown field 'attention'" not in str(exc):
            raise
        raise ConfigError(  # the option asked for it, not the preset file: name the option and the preset
            f"--attention {attention}: the preset {Path(str(preset)).stem!r} (model kind "
            f"{data.get('kind', 'mil')!r}) has no attention to choose; leave --attention out, or choose a "
            "preset whose model takes one (vit-wsi, vit-wsi-small)"
        ) from None


def preset_kind(preset: str | Path) -> str:
    """The model kind a preset builds (`mil`, `abmil`, `vit2d`, ...), read from its YAML."""
    return load_preset(preset).kind


def preset_attention(preset: str | Path) -> str | None:
    """The attention a preset names (its own default), or None when its YAML names none."""
    return load_preset(preset).attention


def input_width_field(kind: str) -> str:
    """The config field that takes the data's input width: `in_dim` where the kind's config has one
    (models over feature bags), else `in_channels` (models over images)."""
    fields = getattr(MODEL_KINDS.get(kind).config_class, "__dataclass_fields__", {})
    return "in_dim" if "in_dim" in fields else "in_channels"


def build_model_from_config(
    config: Mapping[str, Any], *, source: str = "model config", saved: bool = False
) -> KindModel:
    """Rebuild a model from `model.to_dict()` (or a preset mapping).

    `saved`: the mapping comes from a run record, whose absent fields take the values its model trained
    with: gdla without `gdla_block` the legacy block (so its weights load), CLAM's `subtyping: auto | on
    | off` the flag it stands for, DSMIL without `scoring` a softmax.
    """
    if saved:
        config = _saved_defaults(config)
    kind = config.get("kind", "mil")
    try:
        model_cls = MODEL_KINDS.get(kind)
        cfg = parse_config(model_cls.config_class, config, source=source)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith(source) else f"{source}: {message}") from None
    _check_size(model_cls, cfg, source)
    return model_cls(cfg)


def _saved_defaults(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A run record's model config with its absent or older-valued fields as its model trained with them."""
    from wsi.models.baselines.clam import legacy_config

    kind = config.get("kind", "mil")
    if config.get("attention") == "gdla" and "gdla_block" not in config:
        config = {**config, "gdla_block": "legacy"}
    if kind in ("clam_sb", "clam_mb"):
        config = legacy_config(dict(config))
    if kind == "dsmil" and "scoring" not in config:
        config = {**config, "scoring": "softmax"}
    return config


#: the largest model built: 2^31 parameters, 8.6 GB in float32 before gradients and optimizer state (the
#: presets hold 0.04-30 million); each width is bounded on its own
#: (`models.layers.transformer.MAX_MODEL_INT`), this bounds what they make together
MAX_MODEL_PARAMS = 2**31


def _check_size(model_cls: type[KindModel], cfg: Any, source: str) -> None:
    """ConfigError naming the fields when the model would hold more than MAX_MODEL_PARAMS parameters,
    counted on the meta device (no memory), instead of a MemoryError or a machine swapping."""
    try:
        with torch.device("meta"):
            params = sum(p.numel() for p in model_cls(cfg).parameters())
    except Exception:  # a model that cannot be built without memory is checked by its own build
        return
    if params > MAX_MODEL_PARAMS:
        sizes = ", ".join(f"{k} {v}" for k, v in cfg.to_dict().items() if type(v) is int)
        raise ConfigError(
            f"{source}: this model would hold {params:,} parameters ({params * 4 / 1e9:.3g} GB in float32, "
            f"about 4x that to train); the most wsi builds is {MAX_MODEL_PARAMS:,}: lower its widths or "
            f"depth ({sizes})"
        )


def _variant_keys(target: nn.Module) -> tuple[set[str], set[str]]:
    """(keys only the target's attention variants have, dead keys they drop), as full state-dict names.

    A softmax model has the shared skeleton of every attention module (`to_qkv`, `to_out`); whatever
    else a variant owns (seqnorm's gamma/beta, gdla's gate, lambdas, local mixer) is its own and new.
    """
    own, dead = set(), set()
    for name, module in target.named_modules():
        if isinstance(module, AttentionBase):
            prefix = f"{name}." if name else ""
            shared = {"to_qkv.weight", "to_qkv.bias", "to_out.weight", "to_out.bias"}
            own |= {prefix + k for k in module.state_dict() if k not in shared}
            dead |= {prefix + k for k in module.dead_keys}
    return own, dead


def transfer_softmax_to_seqnorm(
    source: nn.Module | Mapping[str, torch.Tensor], target: nn.Module
) -> list[str]:
    """Load a softmax model's weights into a same-shape seqnorm (or other variant) model, in place.

    The paper's section 3.4 recipe: every shared weight (projections `to_qkv`, `to_out`, norms, MLPs,
    class token, head) is copied exactly; the target variant's own new parameters keep their initial
    values (seqnorm's gamma = 1, beta = 0: the identity). Source weights the target drops because they
    cancel in it (seqnorm's Q/K/V biases) are skipped. Returns the sorted target keys that were new.
    Raises WeightsError naming the keys when the source lacks anything else the target needs (a
    shallower model, another width) or has weights the target lacks.
    """
    state = dict(source.state_dict() if isinstance(source, nn.Module) else source)
    own = target.state_dict()
    new_params, dead = _variant_keys(target)
    for key in dead:
        state.pop(key, None)
    extra = sorted(set(state) - set(own))
    if extra:
        raise WeightsError(
            f"the source has {len(extra)} weight(s) the target lacks ({', '.join(extra[:5])}): "
            "build the target with the same preset and overrides"
        )
    missing = sorted(set(own) - set(state) - new_params)
    if missing:
        raise WeightsError(
            f"the source lacks {len(missing)} weight(s) the target needs beyond its attention variant's "
            f"own new parameters, which would stay random: {', '.join(missing[:8])}"
            f"{' ...' if len(missing) > 8 else ''}; "
            "build the target with the source's preset, depth and widths"
        )
    bad = [k for k, v in state.items() if own[k].shape != v.shape]
    if bad:
        k = bad[0]
        raise WeightsError(
            f"weight {k} is {tuple(state[k].shape)} in the source but {tuple(own[k].shape)} in the target; "
            "build the target with the same widths"
        )
    target.load_state_dict(state, strict=False)
    return sorted(set(own) - set(state))

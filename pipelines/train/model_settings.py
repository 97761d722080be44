"""Which of a task's model settings a preset takes: the attention, the scoring and the overrides.

A task names model settings for the preset it was written for (`nsclc-subtype`: `attention: seqnorm`
for vit-wsi, `subtyping: true` for CLAM); trained with another preset (`--preset clam-sb`), each applies
only where that preset's model kind has the field (and, for a field with a fixed set of values, the
value): the attention reaches the transformers, `subtyping` reaches CLAM, and what a preset cannot take
is left out for it, logged. A setting given for THIS run (`--attention`, `model_overrides`) that the
preset cannot take is refused, naming the option and the preset (not the preset's file).

The scoring (`model.scoring`) is resolved here too: the task's when the preset takes one (DSMIL's
`scoring`), else the preset's own, and softmax for every model without the field.
"""

from __future__ import annotations

import dataclasses
import logging
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from wsi.core.errors import ConfigError
from wsi.pipelines.study.tasks import ModelOverrides, TaskConfig

log = logging.getLogger(__name__)

#: what a model without a `scoring` field is trained for: cross-entropy over one output per class
DEFAULT_SCORING = "softmax"


def _config_class(preset: str) -> Any:
    from wsi.models.base.kinds import MODEL_KINDS
    from wsi.models.presets import preset_kind

    return MODEL_KINDS.get(preset_kind(preset)).config_class


def preset_fields(preset: str) -> dict[str, Any]:
    """The preset's model-kind config fields and their types (what its YAML and overrides may set)."""
    cls = _config_class(preset)
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints.get(f.name) for f in dataclasses.fields(cls)}


def _choices(hint: Any) -> tuple[Any, ...] | None:
    """The values a Literal field (possibly Optional or Annotated) allows; None for any other type."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _choices(typing.get_args(hint)[0])
    if origin is Literal:
        return typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        found = [c for arg in typing.get_args(hint) if (c := _choices(arg)) is not None]
        return (*tuple(v for c in found for v in c), None) if found else None
    return None


def takes(preset: str, name: str, value: Any = None) -> bool:
    """Whether the preset's model has a setting `name` (and, with `value`, one of its allowed values:
    a Literal's, or for a transformer's `attention` the attention registry's)."""
    fields = preset_fields(preset)
    if name not in fields:
        return False
    allowed = _choices(fields[name])
    if allowed is None and name == "attention":
        from wsi.models.attention import ATTENTION

        allowed = tuple(ATTENTION.names())
    return value is None or allowed is None or value in allowed


def preset_value(preset: str, name: str, overrides: Mapping[str, Any]) -> Any:
    """A setting's value for the preset: the overrides', else its YAML's, else its config's default."""
    from wsi.models.presets import load_preset

    if name in overrides:
        return overrides[name]
    data = load_preset(preset).data
    if name in data:
        return data[name]
    default = {f.name: f.default for f in dataclasses.fields(_config_class(preset))}.get(name)
    return None if default is dataclasses.MISSING else default


def refuse_untaken(preset: str, given: Mapping[str, Any]) -> None:
    """ConfigError naming each run option (`--attention`, a model override) the preset cannot take."""
    from wsi.models.presets import preset_kind

    bad = {option: value for option, value in given.items() if not _option_taken(preset, option, value)}
    if not bad:
        return
    kind = preset_kind(preset)
    listed = ", ".join(f"{option} {value!r}" for option, value in bad.items())
    fields = ", ".join(sorted(f for f in preset_fields(preset) if f != "kind"))
    raise ConfigError(
        f"{listed}: preset {preset} (model kind {kind}) cannot take {'it' if len(bad) == 1 else 'them'}; "
        f"its settings are {fields}. Leave the option out, or choose a preset that has it"
    )


def _option_taken(preset: str, option: str, value: Any) -> bool:
    name = option.removeprefix("--").removeprefix("model_overrides.")
    return takes(preset, name, value)


def resolve_model_settings(
    task: TaskConfig, preset: str, recipe_overrides: Mapping[str, Any]
) -> dict[str, Any]:
    """The task changes that settle its model settings for `preset`: `model.attention` (the task's when
    the preset takes it, else the preset's own or None), `model.scoring`, and `model.overrides` (the
    recipe's for this preset under the task's own, each kept only where the preset has the field)."""
    from wsi.models.presets import preset_attention

    merged: ModelOverrides = {**recipe_overrides, **task.model.overrides}
    overrides = {k: v for k, v in merged.items() if takes(preset, k)}
    dropped = sorted(set(merged) - set(overrides))
    attention = task.model.attention
    if attention is not None and not takes(preset, "attention", attention):
        dropped.append(f"attention {attention}")
        attention = None
    if dropped:
        log.info("preset %s has no setting for the task's %s: left out", preset, ", ".join(dropped))
    scoring = DEFAULT_SCORING
    if takes(preset, "scoring"):
        scoring = task.model.scoring or preset_value(preset, "scoring", overrides)
        overrides["scoring"] = scoring
    elif task.model.scoring not in (None, DEFAULT_SCORING):
        log.info("preset %s is trained for softmax scores: the task's scoring %s is left out", preset,
                 task.model.scoring)  # fmt: skip
    return {
        "model.attention": attention or (preset_attention(preset) if takes(preset, "attention") else None),
        "model.scoring": scoring,
        "model.overrides": overrides,
    }


def given_model_settings(attention: str | None, model_overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The model settings a run's options give (for `refuse_untaken`), named as the user gave them."""
    given: dict[str, Any] = {f"model_overrides.{k}": v for k, v in model_overrides.items()}
    if attention is not None:
        given["--attention"] = attention
    return given


__all__ = [
    "DEFAULT_SCORING", "given_model_settings", "preset_fields", "preset_value", "refuse_untaken",
    "resolve_model_settings", "takes",
]  # fmt: skip

"""The one way a mapping (YAML, JSON, CLI options) becomes a typed config.

Every config in the project (tasks, model presets, tiling, embedding, the run record) is a dataclass
marked with `@config_model` and parsed with `parse_config`: fields are type-checked and converted by
pydantic, unknown keys are refused, and the error names the source and every bad field at once.
Documenting each field is the dataclass's job (a comment beside it); this module only validates.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable, Mapping
from typing import Any, TypeVar, cast

from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config

from wsi.errors import ConfigError

T = TypeVar("T")

_STRICT_KEYS = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


def config_model(cls: type[T]) -> type[T]:
    """Mark a dataclass as a config: unknown keys are refused when it is parsed."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass to be a config model")
    return with_config(_STRICT_KEYS)(cls)


def _adapter(cls: Any) -> TypeAdapter[Any]:
    # one per class: building it costs ~3 ms, and a bag's provenance is parsed on every read (per epoch)
    return _cached_adapter(cast(Hashable, cls))


@functools.cache
def _cached_adapter(cls: Hashable) -> TypeAdapter[Any]:
    return TypeAdapter(cast(Any, cls))


def parse_config(cls: type[T], data: Mapping[str, Any], *, source: str) -> T:
    """`data` as a `cls`, or a ConfigError that names `source` and lists every bad or unknown key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of {cls.__name__} fields, got {type(data).__name__}")
    try:
        return _adapter(cls).validate_python(dict(data))
    except ValidationError as exc:
        valid = ", ".join(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        problems = "; ".join(_describe(err) for err in exc.errors())
        raise ConfigError(f"{source}: {problems} (valid fields: {valid})") from None


def config_dict(config: Any) -> dict[str, Any]:
    """A config as plain JSON-ready data (tuples become lists); the one serialiser for configs."""
    data: dict[str, Any] = _adapter(type(config)).dump_python(config, mode="json")
    return data


def _describe(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] in {"unexpected_keyword_argument", "extra_forbidden"}:
        return f"unknown field {where!r}"
    if err["type"] == "missing_argument" or err["type"] == "missing":
        return f"missing field {where!r}"
    return f"field {where!r}: {err['msg']} (got {err.get('input')!r})"


__all__ = ["config_dict", "config_model", "parse_config"]

"""The one way a mapping (YAML, JSON, CLI options) becomes a typed config.

Every config in the project (tasks, model presets, tiling, embedding, prediction, the run record) is a
dataclass marked with `@config_model` and parsed with `parse_config`: fields are type-checked and
converted by pydantic, unknown keys are refused, and the error names the source and every bad field at
once. A field a user sets from the command line is declared with `setting(default, help=..., ge=...)`:
its default, range and help text are written once, checked on direct construction and by the parser
alike, and the CLI builds its options from them (`wsi.cli._options`), so they cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import typing
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Literal, TypeVar, cast

from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config

from wsi.errors import ConfigError

T = TypeVar("T")

_STRICT_KEYS = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


_BOUNDS: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<="), "lt": (operator.lt, "<"),
}  # fmt: skip


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    default_factory: Callable[[], Any] | None = None,
    default_text: str | None = None,
    existing: Literal["file", "dir", "any"] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A config field with its help text and range, the one place they are written.

    `default_text` describes a computed default (`default_factory`) in the CLI's help; `existing` makes
    the CLI refuse a path that is not an existing file or folder before any work. The metadata keys
    are pydantic `Field` arguments (pydantic reads a dataclass field's metadata as such): it enforces the
    bounds when parsing, `check_bounds` on direct construction."""
    meta: dict[str, Any] = {"description": help}
    extra = {k: v for k, v in {"default_text": default_text, "existing": existing}.items() if v is not None}
    if extra:
        meta["json_schema_extra"] = extra
    meta.update({k: v for k, v in {"ge": ge, "gt": gt, "le": le, "lt": lt}.items() if v is not None})
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_bounds(config: Any) -> None:
    """Raise ValueError naming the field when a `setting` is out of its range (direct construction too)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        for key, (ok, sign) in _BOUNDS.items():
            if key in f.metadata and not ok(value, f.metadata[key]):
                bound = f.metadata[key]
                raise ValueError(f"{type(config).__name__}.{f.name} must be {sign} {bound}, got {value}")


def config_model(cls: type[T]) -> type[T]:
    """Mark a dataclass as a config: unknown keys are refused when it is parsed, ranges always checked."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass to be a config model")
    if any(_BOUNDS.keys() & f.metadata.keys() for f in dataclasses.fields(cls)):
        _check_after_init(cls)
    return with_config(_STRICT_KEYS)(cls)


def _check_after_init(cls: Any) -> None:
    """Run check_bounds before the class's own __post_init__: pydantic calls __post_init__ after parsing,
    and the dataclass __init__ calls it only when the class had one when @dataclass ran (else wrap it)."""
    own_post_init = getattr(cls, "__post_init__", None)

    def __post_init__(self: Any) -> None:
        check_bounds(self)
        if own_post_init is not None:
            own_post_init(self)

    cls.__post_init__ = __post_init__
    if own_post_init is None:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            check_bounds(self)

        cls.__init__ = __init__


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


def with_settings(cls: type[T], base: T | None, settings: Mapping[str, Any], *, source: str) -> T:
    """`base` (or the defaults) with `settings` applied, validated: a library call's keywords and the
    CLI's options meet the same checks and the same defaults."""
    data = config_dict(base) if base is not None else {}
    return parse_config(cls, {**data, **settings}, source=source)


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


def replace_config(config: T, changes: Mapping[str, Any], *, source: str) -> T:
    """A copy of `config` with dotted-key changes ({"model.attention": "sima", "epochs": 5}): each value
    validated against its own field's type, the groups above it rebuilt with `dataclasses.replace` (so
    ranges are checked again); the other fields are the very objects they were, never re-parsed."""
    for key, value in changes.items():
        config = _replace_one(config, key.split("."), value, key, source)
    return config


def _replace_one(node: Any, path: list[str], value: Any, key: str, source: str) -> Any:
    name, rest = path[0], path[1:]
    if isinstance(node, Mapping):  # a free-form mapping field (input_options): its keys are not typed here
        if not rest:
            return {**node, name: value}
        if name not in node:
            raise ConfigError(f"{source}: cannot set {key!r}: {name!r} is not in the mapping")
        return {**node, name: _replace_one(node[name], rest, value, key, source)}
    if not dataclasses.is_dataclass(node) or isinstance(node, type):
        raise ConfigError(f"{source}: cannot set {key!r}: it is not inside a group of fields")
    hints = _field_types(cast(Hashable, type(node)))
    if name not in hints:
        valid = ", ".join(hints)
        raise ConfigError(f"{source}: cannot set {key!r}: no field {name!r} (valid fields: {valid})")
    if rest:
        new = _replace_one(getattr(node, name), rest, value, key, source)
    else:
        try:
            new = _cached_adapter(hints[name]).validate_python(value)
        except ValidationError as exc:
            problems = "; ".join(str(err["msg"]) for err in exc.errors())
            raise ConfigError(f"{source}: {key}: {problems} (got {value!r})") from None
    try:
        return dataclasses.replace(node, **{name: new})
    except ValueError as exc:  # a range (check_bounds) or a class's own rule
        raise ConfigError(f"{source}: {key}: {exc}") from None


@functools.cache
def _field_types(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


__all__ = [
    "check_bounds",
    "config_dict",
    "config_model",
    "parse_config",
    "replace_config",
    "setting",
    "with_settings",
]

"""The one way a mapping (YAML, JSON, CLI options) becomes a typed config.

Every config is a dataclass marked `@config_model` and read with `parse_config`: pydantic checks and
converts the fields, unknown keys are refused, and one error names the source and every bad field. A
field users set is declared once with `setting(default, help=..., ge=...)`, which the CLI builds its
options from (`wsi.cli._options`), so default, range and help cannot drift apart. Every number is
finite and bounded on both sides (`numeric_leaves`; tests/wsi/core/test_hostile_numbers.py), unless a
record opts out with `config_model(finite=False)` (the resume state's -inf best score).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import types
import typing
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Annotated, Any, Literal, NamedTuple, TypedDict, TypeVar, cast, overload

import annotated_types
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, with_config
from pydantic.fields import FieldInfo

from wsi.core.errors import ConfigError
from wsi.core.json_types import JsonObject

T = TypeVar("T")

#: the largest count a record holds (tiles, slides, epochs): what a signed 64-bit HDF5/JSON integer holds
MAX_COUNT = 2**63 - 1
#: a slide side in pixels: the largest scans are ~250,000 px; 10^7 is beyond any glass slide at 0.01 um/px
MAX_SIDE_PX = 10**7
#: um/px: scans are 0.1-30; a 72-dpi picture is 353; anything coarser is not a slide
MAX_MPP = 10_000.0
#: um/px of tiles as read: tile_um / tile_px at their smallest (1 um over 4096 px)
MIN_TARGET_MPP = 1 / 4096
#: a random seed: NumPy's legacy generator takes no more (torch and Python take all of it)
MAX_SEED = 2**32 - 1
#: tiles drawn per training bag (a task's input_options.bag_size, `wsi train --bag-size`)
MAX_BAG_SIZE = 10**8
#: a length on a slide in um: 1 m, far beyond any glass (75 mm)
MAX_UM = 1e6

# Field types of records and configs that hold these kinds of number (bounded both sides, finite).
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]  # a number of things
SidePx = Annotated[int, Field(ge=1, le=MAX_SIDE_PX)]  # a side in pixels
Mpp = Annotated[float, Field(gt=0, le=MAX_MPP)]  # micrometres per pixel
Um = Annotated[float, Field(gt=0, le=MAX_UM)]  # a positive length in micrometres
Fraction = Annotated[float, Field(ge=0, le=1)]  # a share, 0 to 1

_STRICT_KEYS = ConfigDict(extra="forbid", arbitrary_types_allowed=True, allow_inf_nan=False)
_STRICT_KEYS_INF = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
_FINITE = "__wsi_finite__"  # class attribute: False where a record may hold infinities


_BOUNDS: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<="), "lt": (operator.lt, "<"),
}  # fmt: skip


class _FieldMeta(TypedDict, total=False):
    """A `setting`'s dataclass field metadata: pydantic `Field` arguments (pydantic reads them as such)."""

    description: str
    # default_text, existing (str), choices (a registry's names): read by the CLI (wsi.cli._options)
    json_schema_extra: dict[str, str | Callable[[], Sequence[str]]]
    ge: float
    gt: float
    le: float
    lt: float


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    default_factory: Callable[[], Any] | None = None,
    default_text: str | None = None,
    existing: Literal["file", "dir", "any"] | None = None,
    choices: Callable[[], Sequence[str]] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A config field with its help text and range, the one place they are written.

    `default_text` describes a computed default (`default_factory`) in the CLI's help; `existing` makes
    the CLI refuse a path that is not an existing file or folder before any work; `choices` names the
    registry a string field takes its values from (called when the CLI shows or checks them, so a
    registry that imports torch costs nothing until then; the config checks its own values). The
    metadata keys are pydantic `Field` arguments (pydantic reads a dataclass field's metadata as such):
    it enforces the bounds when parsing, `check_bounds` on direct construction."""
    meta: _FieldMeta = {"description": help}
    given = {"default_text": default_text, "existing": existing, "choices": choices}
    extra = {k: v for k, v in given.items() if v is not None}
    if extra:
        meta["json_schema_extra"] = extra
    if ge is not None:
        meta["ge"] = ge
    if gt is not None:
        meta["gt"] = gt
    if le is not None:
        meta["le"] = le
    if lt is not None:
        meta["lt"] = lt
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class NumericLeaf(NamedTuple):
    """One number a config field holds: `where` is the field name, with `[i]` for a tuple element,
    `[*]` for every element of a variable tuple or list, `[key]` for a mapping's values."""

    field: str
    where: str
    kind: type  # int or float
    bounds: dict[str, float]  # ge / gt / le / lt


def _bounds_of(meta: Any) -> dict[str, float]:
    """Bounds held by one piece of field metadata: a `setting`'s mapping, a pydantic FieldInfo, or an
    annotated_types constraint."""
    if isinstance(meta, Mapping):
        return {k: meta[k] for k in _BOUNDS if k in meta}
    if isinstance(meta, FieldInfo):
        found: dict[str, float] = {}
        for m in meta.metadata:
            found.update(_bounds_of(m))
        return found
    kinds = {
        annotated_types.Ge: "ge",
        annotated_types.Gt: "gt",
        annotated_types.Le: "le",
        annotated_types.Lt: "lt",
    }
    for cls, key in kinds.items():
        if isinstance(meta, cls):
            return {key: getattr(meta, key)}
    if isinstance(meta, annotated_types.Interval):
        return {k: v for k in _BOUNDS if (v := getattr(meta, k)) is not None}
    return {}


def _leaves(hint: Any, name: str, where: str, bounds: dict[str, float]) -> list[NumericLeaf]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        extra: dict[str, float] = {}
        for meta in hint.__metadata__:
            extra.update(_bounds_of(meta))
        return _leaves(args[0], name, where, {**bounds, **extra})
    if origin in (typing.Union, types.UnionType):
        return [leaf for a in args if a is not type(None) for leaf in _leaves(a, name, where, bounds)]
    if hint in (int, float):
        return [NumericLeaf(name, where, hint, bounds)]
    if origin in (tuple, list, set, frozenset):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return [leaf for i, a in enumerate(args) for leaf in _leaves(a, name, f"{where}[{i}]", {})]
        return _leaves(args[0], name, f"{where}[*]", {}) if args else []
    if origin in (dict, Mapping) and len(args) == 2:
        return _leaves(args[1], name, f"{where}[key]", {})
    return []  # str, bool, Literal, Any, a nested config (checked as its own class)


@functools.cache
def numeric_leaves(cls: Any) -> tuple[NumericLeaf, ...]:
    """Every number a config class's own fields hold, with its declared bounds (nested configs are
    their own classes)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out: list[NumericLeaf] = []
    for f in dataclasses.fields(cls):
        out.extend(_leaves(hints[f.name], f.name, f.name, _bounds_of(f.metadata)))
    return tuple(out)


def bounds_of(model: type, name: str) -> Any:  # a dict of ge/gt/le/lt, spread into `setting(...)`
    """The bounds (ge/gt/le/lt) of `model`'s number `name`: a setting that restates another config's
    value (the demo's tile size, train's --epochs) takes its range from the owner, written once there."""
    [leaf] = [n for n in numeric_leaves(model) if n.where == name]
    return dict(leaf.bounds)


def _out_of_range(value: Any, bounds: Mapping[str, float], finite: bool) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if finite and isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    for key, (ok, sign) in _BOUNDS.items():
        if key in bounds and not ok(value, bounds[key]):
            return f"must be {sign} {bounds[key]}"
    return None


def check_bounds(config: Any) -> None:
    """Raise ValueError naming the field when a number is out of its range or not finite (direct
    construction; pydantic checks the same when parsing). Tuple, list and mapping values are checked
    one level deep."""
    finite = getattr(type(config), _FINITE, True)
    for leaf in numeric_leaves(cast(Hashable, type(config))):
        value = getattr(config, leaf.field)
        rest = leaf.where[len(leaf.field) :]
        if not rest:
            items: list[tuple[str, Any]] = [("", value)]
        elif rest == "[*]" and isinstance(value, (tuple, list)):
            items = [(f"[{i}]", v) for i, v in enumerate(value)]
        elif rest == "[key]" and isinstance(value, Mapping):
            items = [(f"[{k!r}]", v) for k, v in value.items()]
        elif rest[1:-1].isdigit() and isinstance(value, (tuple, list)) and int(rest[1:-1]) < len(value):
            items = [(rest, value[int(rest[1:-1])])]
        else:
            continue
        for suffix, v in items:
            why = _out_of_range(v, leaf.bounds, finite)
            if why is not None:
                raise ValueError(f"{type(config).__name__}.{leaf.field}{suffix} {why}, got {v}")


@overload
def config_model(cls: type[T], *, finite: bool = True) -> type[T]: ...
@overload
def config_model(cls: None = None, *, finite: bool = True) -> Callable[[type[T]], type[T]]: ...
def config_model(cls: Any = None, *, finite: bool = True) -> Any:
    """Mark a dataclass as a config: unknown keys are refused when it is parsed, ranges always checked,
    numbers finite unless `finite=False` (`@config_model` or `@config_model(finite=False)`)."""
    if cls is None:
        return functools.partial(config_model, finite=finite)
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass to be a config model")
    setattr(cls, _FINITE, finite)
    _check_after_init(cls)
    return with_config(_STRICT_KEYS if finite else _STRICT_KEYS_INF)(cast(Any, cls))


def _check_after_init(cls: Any) -> None:
    """Run check_bounds before the class's own __post_init__: pydantic calls __post_init__ after parsing,
    and the dataclass __init__ calls it only when the class had one when @dataclass ran (else wrap it)."""
    own_post_init = getattr(cls, "__post_init__", None)
    if getattr(own_post_init, "_wsi_checks", False):
        return  # a subclass of a config model: its parent's wrapper already checks (for this class)

    def __post_init__(self: Any) -> None:
        check_bounds(self)
        if own_post_init is not None:
            own_post_init(self)

    __post_init__._wsi_checks = True  # type: ignore[attr-defined]
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


def parse_config(
    cls: type[T], data: Mapping[str, Any], *, source: str, shown: Mapping[str, str] | None = None
) -> T:
    """`data` as a `cls`, or a ConfigError that names `source` and every bad or unknown key (by the name
    `shown` maps it to: what a file stores it as)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of {cls.__name__} fields, got {type(data).__name__}")
    try:
        return _adapter(cls).validate_python(dict(data))
    except ValidationError as exc:
        valid = ", ".join((shown or {}).get(f.name, f.name) for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        problems = "; ".join(_describe(err, shown) for err in exc.errors())
        raise ConfigError(f"{source}: {problems} (valid fields: {valid})") from None


def with_settings(cls: type[T], base: T | None, settings: Mapping[str, Any], *, source: str) -> T:
    """`base` (or the defaults) with `settings` applied, validated: a library call's keywords and the
    CLI's options meet the same checks and the same defaults."""
    data = config_dict(base) if base is not None else {}
    return parse_config(cls, {**data, **settings}, source=source)


def config_dict(config: Any) -> JsonObject:
    """A config as plain JSON-ready data (tuples become lists); the one serialiser for configs."""
    data: JsonObject = _adapter(type(config)).dump_python(config, mode="json")
    return data


def _describe(err: Any, shown: Mapping[str, str] | None = None) -> str:
    loc = [str((shown or {}).get(p, p)) if i == 0 else str(p) for i, p in enumerate(err["loc"])]
    where = ".".join(loc) or "(top level)"
    if err["type"] in {"unexpected_keyword_argument", "extra_forbidden"}:
        return f"unknown field {where!r}"
    if err["type"] == "missing_argument" or err["type"] == "missing":
        return f"missing field {where!r}"
    if err["type"] == "value_error" and isinstance(err.get("input"), (Mapping, tuple)):
        return f"{where}: {err['msg'].removeprefix('Value error, ')}"  # a rule of the class: no input dump
    return f"field {where!r}: {err['msg']} (got {_short(err.get('input'))})"


def _short(value: Any, limit: int = 120) -> str:
    """A value for a message, cut short: a hostile file's megabyte string must not fill the terminal."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


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
    name = getattr(type(node), "OLD_NAMES", {}).get(name, name)  # a renamed field's old name (new_names)
    if name not in hints:
        valid = ", ".join(hints)
        raise ConfigError(f"{source}: cannot set {key!r}: no field {name!r} (valid fields: {valid})")
    if rest:
        new = _replace_one(getattr(node, name), rest, value, key, source)
    else:
        try:
            new = _value_adapter(hints[name], getattr(type(node), _FINITE, True)).validate_python(value)
        except ValidationError as exc:
            problems = "; ".join(str(err["msg"]) for err in exc.errors())
            raise ConfigError(f"{source}: {key}: {problems} (got {value!r})") from None
    try:
        return dataclasses.replace(node, **{name: new})
    except ValueError as exc:  # a range (check_bounds) or a class's own rule
        raise ConfigError(f"{source}: {key}: {exc}") from None


@functools.cache
def _value_adapter(hint: Any, finite: bool) -> TypeAdapter[Any]:
    """A validator for one field's type; NaN and infinities refused where the config's are."""
    if finite and not _holds_config(hint):
        return TypeAdapter(hint, config=ConfigDict(allow_inf_nan=False))
    return _cached_adapter(hint)  # a config group: its own class says


def _holds_config(hint: Any) -> bool:
    return (dataclasses.is_dataclass(hint) and isinstance(hint, type)) or any(
        _holds_config(a) for a in typing.get_args(hint)
    )


@functools.cache
def _field_types(cls: Any) -> dict[str, object]:  # field name -> its type hint
    hints = typing.get_type_hints(cls, include_extras=True)  # Annotated ranges apply to a change too
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


__all__ = [
    "MAX_COUNT",
    "MAX_MPP",
    "MAX_SEED",
    "MAX_SIDE_PX",
    "MAX_UM",
    "MIN_TARGET_MPP",
    "Count",
    "Fraction",
    "Mpp",
    "NumericLeaf",
    "SidePx",
    "Um",
    "check_bounds",
    "config_dict",
    "config_model",
    "numeric_leaves",
    "parse_config",
    "replace_config",
    "setting",
    "with_settings",
]

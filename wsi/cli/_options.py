"""Command-line options built from config models, so a default, a range or a help text is written once.

`config_options(Model, {"--tile-um": "tile_um", "--thumb-mpp": "tissue.thumb_mpp"}, into="tiling")`
adds one option per field path, typed, ranged, defaulted and described from the field's `setting`
(`wsi.core.config.setting`), and hands the command one nested mapping (`tiling=...`) ready for
`parse_config(Model, ...)`. A field with a computed default (`default_factory`) gets no click default:
left out, the model computes it.

Every number an option takes has a range on both sides and is finite: `FiniteFloatRange` refuses
`nan` and `inf` (click's FloatRange lets NaN through: every comparison with it is false), and
`field_type(Model, "path")` gives an option that no config model owns the range of the field it sets
(`wsi train --seed` takes TaskConfig.seed's). tests/wsi/core/test_hostile_numbers.py checks every command.

A `Literal` field is a choice of its values; a `tuple[X, ...]` field a repeatable option; a bool field a
switch, `--x` (or `--x/--no-x` when on by default), or the flags given as `"--on/--off"`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import click

F = TypeVar("F", bound=Callable[..., Any])


class ConfigOption(click.Option):
    """A click option that knows the config field it sets (tests compare defaults through this)."""

    def __init__(self, *args: Any, model: type, path: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model, self.path = model, path


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, refusing NaN and infinities (which pass its comparisons or mean nothing)."""

    name = "float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class RegistryChoice(click.Choice):
    """A click Choice whose names come from a registry when first shown or checked, so building the
    option imports nothing (the attention registry imports torch); the names are never restated."""

    def __init__(self, names: Callable[[], Sequence[str]]) -> None:
        self._names = names
        super().__init__((), case_sensitive=True)

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self._names())

    @choices.setter
    def choices(self, value: Any) -> None:  # click.Choice.__init__ assigns it; the registry decides
        pass


def number_type(kind: type, meta: Mapping[str, Any]) -> click.ParamType:
    """An IntRange or FiniteFloatRange from a field's bounds (ge / gt / le / lt)."""
    lo = meta.get("ge", meta.get("gt"))
    hi = meta.get("le", meta.get("lt"))
    if kind is int:
        # an integer range is closed: > 0 is >= 1
        return click.IntRange(min=lo, max=hi, min_open="gt" in meta, max_open="lt" in meta)
    return FiniteFloatRange(min=lo, max=hi, min_open="gt" in meta, max_open="lt" in meta)


def field_type(model: type, path: str) -> click.ParamType:
    """The click type of the number the field at `path` holds, with the field's own range."""
    from wsi.core.config import numeric_leaves

    *parents, leaf = path.split(".")
    cls = field_of(model, ".".join(parents))[1] if parents else model
    found = [n for n in numeric_leaves(cls) if n.where == leaf]
    if len(found) != 1:
        raise TypeError(f"{model.__name__}.{path} is not one number")
    return number_type(found[0].kind, found[0].bounds)


def field_of(model: type, path: str) -> tuple[dataclasses.Field[Any], Any]:
    """The dataclass field at a dotted path and its resolved type."""
    cls: Any = model
    parts = path.split(".")
    for i, name in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if name not in fields:
            raise KeyError(f"{model.__name__} has no field {path!r}")
        hint = typing.get_type_hints(cls)[name]
        if i == len(parts) - 1:
            return fields[name], hint
        cls = hint
    raise KeyError(path)  # unreachable: an empty path


def model_default(model: type, path: str) -> Any:
    """The default a model gives the field at `path` (computed ones evaluated)."""
    f, _ = field_of(model, path)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _click_type(hint: Any, meta: Mapping[str, Any]) -> tuple[Any, bool, bool]:
    """(click type, is a flag, repeatable) for a field type; Optional[X] is X with default None, and
    tuple[X, ...] is X given once per value."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _click_type(args[0], meta)[0], False, True
    if hint is bool:
        return bool, True, False
    if typing.get_origin(hint) is Literal:
        return click.Choice([str(a) for a in typing.get_args(hint)]), False, False
    if hint in (int, float):
        return number_type(hint, meta), False, False
    return str, False, False


def _local_path_only(hint: Any) -> bool:
    """A field that takes a local path only (Path, not also str or a URL type)."""
    from wsi.storage import Url

    args = set(typing.get_args(hint)) or {hint}
    return Path in args and not args & {str, Url}


def _path_type(hint: Any, *, file_okay: bool, dir_okay: bool) -> click.ParamType:
    """An existing path; also a URL where the field takes one (`wsi.storage.Url` in its type)."""
    from wsi.storage import Url

    if Url in typing.get_args(hint):
        from wsi.cli._locations import PathOrUrl

        return PathOrUrl(exists=True, file_okay=file_okay, dir_okay=dir_okay)
    from wsi.cli._locations import LocalPath

    return LocalPath(exists=True, file_okay=file_okay, dir_okay=dir_okay, path_type=None)


def _option(model: type, flag: str, path: str) -> Callable[[F], F]:
    f, hint = field_of(model, path)
    meta = f.metadata
    if "description" not in meta:
        raise TypeError(f"{model.__name__}.{path} has no help text: declare it with wsi.core.config.setting")
    kind, is_flag, multiple = _click_type(hint, meta)
    extra = meta.get("json_schema_extra", {})
    if extra.get("choices") is not None:
        kind = RegistryChoice(extra["choices"])
    existing = extra.get("existing")
    if existing is not None:  # refused before any work, as click does for its own paths
        kind = _path_type(hint, file_okay=existing != "dir", dir_okay=existing != "file")
    elif _local_path_only(hint):  # a URL named as one, never made the local path s3:/b/x
        from wsi.cli._locations import LocalPath

        kind = LocalPath(path_type=None)
    computed = f.default is dataclasses.MISSING
    default = None if computed else f.default
    default_text = extra.get("default_text")
    help_text = meta["description"] + (f" [default: {default_text}]" if default_text else "")
    param = "_cfg_" + path.replace(".", "__")
    if is_flag:
        # a switch that is on by default is turned off by --no-x (or the off flag given: "--x/--no-y");
        # one that is None by default (left to something else, a task's own value) is three-way: --x,
        # --no-x, or neither (None)
        both = "/" in flag or not (default or default is None)
        on_off = flag if both else f"{flag}/--no-{flag.removeprefix('--')}"
        decls = [on_off, param]
        return click.option(
            *decls, cls=ConfigOption, model=model, path=path, is_flag=True,
            default=None if default is None else bool(default), show_default=bool(default), help=help_text,
        )  # fmt: skip
    required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    return click.option(
        flag, param, cls=ConfigOption, model=model, path=path, type=kind, default=default, multiple=multiple,
        show_default=default is not None, required=required, help=help_text,
    )  # fmt: skip


def config_options(model: type, flags: Mapping[str, str], *, into: str) -> Callable[[F], F]:
    """Add an option per `flags` entry (option -> field path) and pass them as one nested mapping `into`."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values: dict[str, Any] = {}
            for path in flags.values():
                value = kwargs.pop("_cfg_" + path.replace(".", "__"))
                if value is None and field_of(model, path)[0].default is dataclasses.MISSING:
                    continue  # a computed default: the model computes it
                node = values
                *parents, leaf = path.split(".")
                for part in parents:
                    node = node.setdefault(part, {})
                node[leaf] = value
            kwargs[into] = values
            return func(*args, **kwargs)

        decorated: Any = wrapper
        for flag, path in reversed(list(flags.items())):
            decorated = _option(model, flag, path)(decorated)
        return cast(F, decorated)

    return decorate

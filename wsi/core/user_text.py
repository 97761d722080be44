"""Text files users write (task, preset and encoder YAML, labels and slide-list CSVs), read one way.

- Text is UTF-8 (a byte-order mark is dropped). There is no silent Latin-1 fallback: a file saved in
  another encoding gets an error naming the file, the line and byte offset of the first bad byte and
  how to convert it, because guessing turns "é" into "Ã©" in labels without a sign.
- YAML is parsed without anchors and aliases (`&a` / `*a`, and so `<<: *a` merges): nested aliases
  expand exponentially (a "billion laughs" file of a few hundred bytes fills any memory), and no
  config of ours needs them. Files are capped at MAX_YAML_BYTES and nesting at MAX_YAML_DEPTH.
- JSON (run records, GeoJSON, stain references, model configs) is parsed by `parse_json`, which turns
  everything the parser can raise into the caller's error naming the file: syntax, and nesting deeper
  than Python's recursion allows (a 200,000-deep `[[[...]]]` raised RecursionError, naming nothing).
  With `finite=True` (coordinates, stain numbers) NaN, Infinity and `1e999` are refused too; typed
  configs refuse them anyway (`wsi.core.config`).
- CSV headers may not repeat a column or hold two names that differ only by case or spaces: csv's
  DictReader keeps the last of two equal names silently, so "label" twice trained on the second.

Every refusal is a ConfigError (or the caller's error class) naming the file and the fix.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

import yaml

from wsi.core.errors import ConfigError, WsiError
from wsi.core.files import special_file_kind, special_file_message

#: config files are a few KB; a larger "config" is a mistake (or an attack on the parser)
MAX_YAML_BYTES = 1 << 20
#: mappings/lists nested deeper than this are refused (PyYAML recurses once per level)
MAX_YAML_DEPTH = 64
#: text tables (labels, slide lists): a million rows are tens of megabytes
MAX_TEXT_BYTES = 1 << 28
#: JSON files of ours (run records, stain references, model configs) are kilobytes; GeoJSON of a whole
#: slide's annotations can be tens of megabytes
MAX_JSON_BYTES = 1 << 28


def decode_utf8(data: bytes, source: str, *, error: type[WsiError] = ConfigError) -> str:
    """`data` as text (UTF-8, BOM dropped), or `error` naming `source`, the line and the byte offset."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = exc.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, start) + 1
        raise error(
            f"{source} is not UTF-8 text: byte {start} (line {line}) is 0x{data[start]:02x}. Save it as "
            f"UTF-8 (e.g. iconv -f latin1 -t utf-8 {source} > fixed{Path(source).suffix or '.txt'}, or "
            "'Save as... UTF-8' in a spreadsheet or editor)"
        ) from None


def read_utf8(
    path: str | os.PathLike[str],
    *,
    what: str = "file",
    error: type[WsiError] = ConfigError,
    max_bytes: int = MAX_TEXT_BYTES,
) -> str:
    """The text of a user's file, UTF-8 only (see `decode_utf8`), at most `max_bytes` long; unreadable
    files name the reason."""
    path = Path(path)
    kind = special_file_kind(path)
    if kind:
        raise error(special_file_message(path, what, kind))
    try:
        if path.stat().st_size > max_bytes:
            raise error(f"{what} {path} is {path.stat().st_size} bytes; at most {max_bytes} are read")
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    return decode_utf8(data, str(path), error=error)


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases (and so exponential expansion) and deep nesting."""

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        # the scanner's simple-key bookkeeping is quadratic in the flow depth: 3000 "[" take 2 s
        if self.flow_level >= MAX_YAML_DEPTH:
            raise yaml.scanner.ScannerError(
                None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", self.get_mark()
            )
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name, <<: *name) are not allowed in config files: write the "
                "values out", event.start_mark,
            )  # fmt: skip
        depth = getattr(self, "_wsi_depth", 0)
        if depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark
            )
        self._wsi_depth = depth + 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._wsi_depth = depth


def parse_yaml(text: str, source: str) -> Any:
    """YAML text as Python data, without aliases; ConfigError naming `source` and the line at fault."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{source} is {len(text)} characters; a config file is at most {MAX_YAML_BYTES}")
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None


def load_yaml_file(path: str | os.PathLike[str], *, what: str = "YAML file") -> Any:
    """A user's YAML file: UTF-8, size-capped, without aliases (see the module docstring)."""
    path = Path(path)
    kind = special_file_kind(path)
    if kind:
        raise ConfigError(special_file_message(path, what, kind))
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if size > MAX_YAML_BYTES:
        raise ConfigError(f"{what} {path} is {size} bytes; a config file is at most {MAX_YAML_BYTES} bytes")
    return parse_yaml(read_utf8(path, what=what), str(path))


class _JsonHooks(TypedDict, total=False):
    """`json.loads` hooks that refuse NaN, Infinity and numbers beyond float (`finite=True`)."""

    parse_constant: Callable[[str], float]
    parse_float: Callable[[str], float]


def parse_json(text: str, source: str, *, error: type[WsiError] = ConfigError, finite: bool = False) -> Any:
    """JSON text as Python data, or `error` naming `source` and what is wrong (see the module docstring)."""
    hooks: _JsonHooks = {"parse_constant": _not_json, "parse_float": _finite_float} if finite else {}
    try:
        return json.loads(text, **hooks)
    except RecursionError:
        raise error(f"{source}: nested too deeply to be read (deeper than Python recursion goes)") from None
    except ValueError as exc:  # JSONDecodeError, and the two refusals below
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise error(f"{source} is not valid JSON: {msg}{where}") from None


def _not_json(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is too large for a number")
    return value


def load_json_file(
    path: str | os.PathLike[str],
    *,
    what: str = "JSON file",
    error: type[WsiError] = ConfigError,
    max_bytes: int = MAX_JSON_BYTES,
    finite: bool = False,
) -> Any:
    """A user's JSON file (UTF-8, at most `max_bytes`), or `error` naming it and the reason."""
    path = Path(path)
    kind = special_file_kind(path)
    if kind:
        raise error(special_file_message(path, what, kind))
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if size > max_bytes:
        raise error(f"{what} {path} is {size} bytes; at most {max_bytes} are read")
    return parse_json(read_utf8(path, what=what, error=error), f"{what} {path}", error=error, finite=finite)


def check_header(
    fieldnames: Sequence[str] | None, source: str, *, error: type[WsiError] = ConfigError
) -> list[str]:
    """The CSV header's column names, refusing a repeated or ambiguous one (equal but for case or
    surrounding spaces): csv.DictReader would keep only the last of two equal names. Unnamed columns
    (a spreadsheet's trailing comma) are let through: nothing reads them."""
    names = list(fieldnames or [])
    seen: dict[str, str] = {}
    for name in names:
        key = (name or "").strip().casefold()
        if not key:
            continue
        if key in seen:
            same = "twice" if seen[key] == name else f"as {seen[key]!r} and {name!r}"
            raise error(
                f"{source}: the header names column {name.strip()!r} {same}; which one is meant is "
                "ambiguous: rename or delete one of them"
            )
        seen[key] = name
    return names


__all__ = [
    "MAX_JSON_BYTES",
    "MAX_TEXT_BYTES",
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "check_header",
    "decode_utf8",
    "load_json_file",
    "load_yaml_file",
    "parse_json",
    "parse_yaml",
    "read_utf8",
]

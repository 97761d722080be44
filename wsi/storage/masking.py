"""The one filter every message a user sees passes through: errors (WsiError, click's usage errors),
log records and manifest notes.

`shown(text)` masks secrets (`wsi.storage.urls.redact`: user:password parts of URLs, signed query values,
the values of credential variables) and names a remote location by its URL rather than by this machine's
folder for it: a path inside a mirror of a remote output folder (`<cache>/outputs/<hash>/...`) or inside a
local copy of a remote file (`<cache>/files/<hash>/data/...`) becomes the URL it stands for, since that
is what the user gave and what another machine can open.

`MaskingFormatter` is a logging formatter that applies it to every formatted record (the message and any
traceback text), installed by the command line on the root logger's handlers; `MaskedStream` applies it
to every write of a text stream (the command line's stdout and stderr: tables, summaries, recipes).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

from wsi.storage.urls import join, redact

_HASH = r"[0-9a-f]{24}"


def shown(text: object) -> str:
    """`text` fit to show a user: secrets masked, local mirrors and cache copies named by their URL."""
    out = redact(text)
    root = _cache_root()
    if root is None or str(root) not in out:
        return out
    return _pattern(str(root)).sub(_as_url, out)


def _cache_root() -> Path | None:
    """The cache root as the environment sets it (None when the settings are invalid: nothing to map)."""
    env = os.environ
    return _root_for(env.get("WSI_CACHE_DIR"), env.get("XDG_CACHE_HOME"), env.get("HOME"))


@lru_cache(maxsize=8)
def _root_for(cache_dir: str | None, xdg: str | None, home: str | None) -> Path | None:
    from wsi.storage.settings import StorageSettings

    try:
        return StorageSettings(cache_dir=Path(cache_dir) if cache_dir else None).root.absolute()
    except Exception:  # invalid settings are reported by check_environment; a message must still print
        return None


@lru_cache(maxsize=8)
def _pattern(root: str) -> re.Pattern[str]:
    base = re.escape(root.rstrip("/"))
    return re.compile(
        rf"{base}/(?:(?P<kind>outputs)/(?P<out>{_HASH})|files/(?P<file>{_HASH})/data)(?P<rest>(?:/[^\s'\"`,;()]*)?)"
    )


def _as_url(match: re.Match[str]) -> str:
    root = _cache_root()
    if root is None:
        return match.group(0)
    rest = match.group("rest").strip("/")
    if match.group("kind"):
        url = _read(root / "outputs" / match.group("out") / ".wsi-sync" / "url")
        return str(join(url, rest)) if url else match.group(0)
    entry = _read(root / "files" / match.group("file") / "entry.json")
    try:
        found = json.loads(entry).get("url") if entry else None
    except (ValueError, AttributeError):
        found = None
    if not isinstance(found, str):
        return match.group(0)
    url = found
    parent = url.rstrip("/").rsplit("/", 1)[0]
    return str(join(parent, rest)) if rest else parent


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


class MaskingFormatter(logging.Formatter):
    """A formatter whose output (message, exception and stack text) passes through `shown`."""

    def format(self, record: logging.LogRecord) -> str:
        return shown(super().format(record))


def mask_log_handlers(logger: logging.Logger | None = None) -> None:
    """Give every handler of `logger` (default: the root logger) a masking formatter, keeping its format."""
    for handler in (logger or logging.getLogger()).handlers:
        current = handler.formatter
        fmt = current._fmt if current is not None else None
        datefmt = current.datefmt if current is not None else None
        handler.setFormatter(MaskingFormatter(fmt, datefmt))


class MaskedStream:
    """A text stream whose writes pass through `shown` (the command line wraps stdout and stderr in it);
    everything else (encoding, isatty, buffer, flush) is the wrapped stream's."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(shown(text) if isinstance(text, str) and text else text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def display_path(path: str | os.PathLike[str]) -> str:
    """A path or URL as a message names it (`shown`)."""
    return shown(os.fspath(path))


__all__ = ["MaskedStream", "MaskingFormatter", "display_path", "mask_log_handlers", "shown"]

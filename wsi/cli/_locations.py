"""The click type of options and arguments that take a local path or a URL (s3://, gs://, https://).

click.Path would turn `s3://bucket/run` into the path `s3:/bucket/run`; `PathOrUrl` keeps a URL as a
checked `wsi.storage.Url` (refusing one that holds credentials, without echoing them) and gives a local
path to click.Path's own checks (exists, file or folder), so a missing local file is the same usage
error as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from wsi.core.errors import WsiError
from wsi.storage import Url, location


class PathOrUrl(click.ParamType):
    name = "path|url"

    def __init__(self, *, exists: bool = False, file_okay: bool = True, dir_okay: bool = True) -> None:
        self._local = click.Path(exists=exists, file_okay=file_okay, dir_okay=dir_okay, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path | Url:
        if isinstance(value, Url):
            return value
        try:
            where = location(str(value))
        except WsiError as exc:
            self.fail(str(exc), param, ctx)
        if isinstance(where, Url):
            return where
        converted: Path = self._local.convert(str(where), param, ctx)
        return converted


__all__ = ["PathOrUrl"]

"""The click type of options and arguments that take a local path or a URL (s3://, gs://, https://).

click.Path would turn `s3://bucket/run` into the path `s3:/bucket/run`; `PathOrUrl` keeps a URL as a
checked `wsi.storage.Url` (refusing one that holds credentials, without echoing them) and gives a local
path to click.Path's own checks (exists, file or folder), so a missing local file is the same usage
error as before. `LocalPath` is click.Path for options that take a local file or folder only: a URL is
told to be one (not "does not exist", which would quote it back), and a pipe, device or socket is refused
where a file is read whole (`wsi.core.files.special_file_kind`). Every value quoted in an error is masked
(`wsi.storage.masking.shown`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from wsi.core.errors import WsiError
from wsi.storage import Url, location


class LocalPath(click.Path):
    """click.Path (as a pathlib.Path) that names a URL as one and refuses pipes, devices and sockets."""

    def __init__(
        self, *, exists: bool = False, file_okay: bool = True, dir_okay: bool = True, path_type: Any = Path
    ) -> None:
        super().__init__(exists=exists, file_okay=file_okay, dir_okay=dir_okay, path_type=path_type)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from wsi.core.files import special_file_kind, special_file_message
        from wsi.storage import is_url
        from wsi.storage.masking import shown

        if is_url(str(value)):  # never Path(url): s3://b/x would become the local folder s3:/b/x
            fix = "copy it here first" if self.exists else "give a local folder, then copy it there"
            self.fail(f"{shown(value)} is a URL; this option takes a local file or folder: {fix}", param, ctx)
        kind = special_file_kind(str(value))
        if kind:
            self.fail(special_file_message(value, "", kind).strip(), param, ctx)
        return super().convert(value, param, ctx)


class PathOrUrl(click.ParamType):
    name = "path|url"

    def __init__(self, *, exists: bool = False, file_okay: bool = True, dir_okay: bool = True) -> None:
        self._local = LocalPath(exists=exists, file_okay=file_okay, dir_okay=dir_okay)

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


__all__ = ["LocalPath", "PathOrUrl"]

"""A per-slide job whose outputs go to a remote folder, on whichever machine runs it.

A dask worker on another machine shares no file system with the client: the job runs in that machine's
own mirror of the remote output folder (`wsi.storage.Mirror`), pulls the slide's earlier outputs (so the
stage's resume checks see them), runs the stage's function unchanged, and pushes what it changed, the
slide's "done" file last (see `wsi.storage.mirror` for why a kill never leaves a file that a re-run takes
as finished). The stage's job settings only need a `remote` URL and an `out_dir` to replace.

    mirrored_job(item, *, fn, job, files) -> JobResult   run_jobs' function (picklable with partial)

And whole-run stages (train, predict) that read and write folders: `@remote_edges(...)` gives them URLs
for their keyword arguments; inside they see local paths only.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar, cast

from pydantic import PlainValidator

from wsi.pipelines.scheduling.results import JobResult
from wsi.storage import Mirror, Url, local_file, local_folder, location, remote_output
from wsi.storage.folder_lock import output_lock


def _location(value: Any) -> Path | Url | None:
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise ValueError(f"expected a path or a URL, got {type(value).__name__}")
    return location(value)


#: a config field (`wsi.core.config.setting`) that holds a local path or a URL (s3://, gs://, https://):
#: parsed by `wsi.storage.location`, so a URL stays a `Url` until `remote_edges` gives the stage its local
#: copy; the CLI's option takes either (`wsi.cli._options`)
Location = Annotated[Path | Url | None, PlainValidator(_location)]


class _Item(Protocol):
    @property
    def slide_id(self) -> str: ...


class _RemoteJob(Protocol):
    @property
    def remote(self) -> str | None: ...


J = TypeVar("J", bound=_RemoteJob)
T = TypeVar("T", bound=_Item)


def mirrored_job(
    item: T,
    *,
    fn: Callable[[T, J], JobResult],
    job: J,
    files: Callable[[str], tuple[list[str], str]],
) -> JobResult:
    """fn(item, job) in this machine's mirror of `job.remote`; `files(slide_id)` names the slide's
    outputs relative to the output folder and its done file (pushed last)."""
    if job.remote is None:
        return fn(item, job)
    mirror = Mirror(Url(job.remote))
    others, done = files(item.slide_id)
    rels = [*others, done]
    mirror.pull(rels)
    local: Any = dataclasses.replace(job, out_dir=mirror.local)  # type: ignore[type-var]
    try:
        return fn(item, local)
    finally:
        mirror.push(rels, last=[done])


# ------------------------------------------------------------------------------ whole-run stages
F = TypeVar("F", bound=Callable[..., Any])


def remote_edges(
    *, out: str, files: Mapping[str, str] = {}, folders: Mapping[str, str] = {}, runs: tuple[str, ...] = (),
    hook: str | None = None, units: tuple[str, ...] = (),
    guard: Callable[[dict[str, Any]], None] | None = None,
) -> Callable[[F], F]:  # fmt: skip
    """Let a whole-run stage (train, predict) take URLs for its keyword arguments, unchanged inside.

    files:   argument -> what it is ("label table"): a remote file is copied to the local cache
    folders: argument -> what it is ("bag folder"): a remote folder is pulled into its local mirror
    runs:    arguments naming a run folder or a .safetensors file (--init-from, --model)
    out:     the output folder: a remote one is pulled (resume), the stage runs in its mirror, and what
             it wrote is uploaded when it returns or fails, and after every epoch through `hook` (the
             stage's per-epoch callback argument, chained with the caller's); folders named in `units`
             (resume/) go up as wholes. The folder's lock is held from the pull to the last upload.
    guard:   called with the arguments as given, before any of them is made local.
    """

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(**kwargs: Any) -> Any:
            if guard is not None:  # checks on the arguments as given (URLs), before anything is fetched
                guard(kwargs)
            for name, what in files.items():
                if kwargs.get(name) is not None:
                    kwargs[name] = local_file(kwargs[name], what=what)
            for name, what in folders.items():
                if kwargs.get(name) is not None:
                    kwargs[name] = _local_folder(kwargs[name], what)
            for name in runs:
                if kwargs.get(name) is not None:
                    kwargs[name] = _local_run(kwargs[name])
            mirror = remote_output(kwargs.get(out))
            if mirror is None:
                return fn(**kwargs)
            # the folder's lock (this machine's and the remote one every machine honours) from before the
            # pull to after the last upload: no other writer's files can come between
            with output_lock(mirror.local):
                mirror.pull_folder(units=units)
                kwargs[out] = mirror.local
                if hook is not None:
                    kwargs[hook] = functools.partial(_after_epoch, mirror, units, kwargs.get(hook))
                try:
                    return fn(**kwargs)
                finally:
                    mirror.push_all(units=units)

        return cast(F, inner)

    return wrap


def _local_folder(folder: Any, what: str) -> Any:
    where = location(folder, what=what)
    return local_folder(where) if isinstance(where, Url) else folder


def _local_run(given: Any) -> Any:
    """A run folder or a weights file, local; a remote run folder without its resume/ state."""
    where = location(given, what="run folder")
    if not isinstance(where, Url):
        return given
    if where.suffix == ".safetensors":
        return local_file(where, what="weights file")
    mirror = Mirror(where)
    mirror.pull_folder(skip=("resume",))
    return mirror.local


def _after_epoch(mirror: Mirror, units: tuple[str, ...], hook: Callable[..., Any] | None, row: Any) -> None:
    if hook is not None:
        hook(row)
    mirror.push_all(units=units)


__all__ = ["Location", "mirrored_job", "remote_edges"]

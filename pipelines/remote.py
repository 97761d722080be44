"""A per-slide job whose outputs go to a remote folder, on whichever machine runs it.

A dask worker on another machine shares no file system with the client: the job runs in that machine's
own mirror of the remote output folder (`wsi.storage.Mirror`), pulls the slide's earlier outputs (so the
stage's resume checks see them), runs the stage's function unchanged, and pushes what it changed, the
slide's "done" file last (see `wsi.storage.mirror` for why a kill never leaves a file that a re-run takes
as finished). The stage's job settings only need a `remote` URL and an `out_dir` to replace.

    mirrored_job(item, *, fn, job, files) -> JobResult   run_jobs' function (picklable with partial)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from wsi.pipelines.jobs import JobResult
from wsi.storage import Mirror, Url


class _Item(Protocol):
    slide_id: str


class _RemoteJob(Protocol):
    remote: str | None


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


__all__ = ["mirrored_job"]

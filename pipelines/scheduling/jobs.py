"""Run one job per slide (or other item), inline or on dask.distributed, and record a manifest.

Public API:

    JobResult(slide_id, path, status "ok"|"skipped"|"empty"|"failed", n=0, seconds=0.0, error="")
    run_jobs(items, fn, *, workers=1, scheduler=None, desc="slides", worker_plugin=None, at_once=1,
             unit="items", labels=None) -> list[JobResult]          # one per item, in the order of `items`
    worker_plugin(name) -> object    # inside `fn`: the plugin registered for this batch
    write_manifest(path, results, *, keep_others=True)   # CSV: slide,path,status,tiles,seconds,error
    read_manifest(path) -> list[JobResult]
    JobsInterrupted(finished)        # Ctrl-C in run_jobs: `finished[i]` the row of item i, None if not done
    RunSummary.of(results, seconds) -> counts per status, items produced, `.line(stage)`, `.failed`

`items` are objects with `slide_id` and `path` attributes (e.g. `wsi.slides.sources.SlideSource`); `fn(item)`
is a picklable top-level callable (or functools.partial of one) returning an JobResult. Any exception
in `fn` becomes a failed row (a WsiError's message as is, anything else as `TypeName: message`); a
batch never stops for one item. `workers=1` (or a single item) runs inline (`at_once` items at a time,
on threads of this process); `workers>1` starts a
LocalCluster of worker processes; `scheduler="tcp://host:port"` uses an existing cluster. `worker_plugin` (a
`distributed.WorkerPlugin`, with a `name`) is set up once per worker, or once inline, and `fn` reaches it
through `worker_plugin(name)`.
"""

from __future__ import annotations

import contextlib
import contextvars
import csv
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from wsi.core.errors import WsiError
from wsi.core.files import disk_full_error, is_disk_full, write_csv_atomic
from wsi.core.progress import Bar, progress
from wsi.pipelines.scheduling.cluster import (
    close_local_cluster,
    main_script_hidden,
    quiet_distributed,
    start_local_cluster,
)
from wsi.pipelines.scheduling.results import STATUSES, JobResult, RunSummary, Status

log = logging.getLogger(__name__)

MANIFEST_COLUMNS = ("slide", "path", "status", "tiles", "seconds", "error", "note")

# Plugins of the inline batch now running, by name (scoped to run_jobs; a dask worker keeps its own).
_INLINE_PLUGINS: contextvars.ContextVar[dict[str, object]] = contextvars.ContextVar("inline_plugins")


class JobsInterrupted(KeyboardInterrupt):
    """Ctrl-C during a batch. `finished` (in the order of the items) holds the rows of the items that
    were done, None for the others, so a stage records them in its manifest before it stops: files are
    the truth a re-run resumes from, but the manifest is what a user reads."""

    def __init__(self, finished: Sequence[JobResult | None]) -> None:
        super().__init__()
        self.finished = list(finished)


def describe_error(exc: BaseException) -> str:
    """A one-line reason for the manifest: a WsiError's message as is, else `TypeName: message`."""
    if isinstance(exc, WsiError):
        return str(exc)
    if is_disk_full(exc):  # a write outside the atomic writers (zarr pixels, appends): say it plainly
        where = getattr(exc, "filename", None)
        return str(
            disk_full_error(Path(where).parent if where else Path.cwd(), None, str(where or "an output"))
        )
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _call(fn: Callable[[Any], JobResult], item: Any) -> JobResult:
    """Run `fn(item)`, turning any exception into a failed row; fill in the time taken."""
    start = time.perf_counter()
    try:
        result = fn(item)
        if not isinstance(result, JobResult):
            raise TypeError(f"batch function returned {type(result).__name__}, expected JobResult")
    except Exception as exc:
        log.debug("%s failed", getattr(item, "slide_id", item), exc_info=True)
        result = JobResult(_item_id(item), _item_path(item), "failed", error=describe_error(exc))
    if not result.seconds:
        result.seconds = time.perf_counter() - start
    return result


def _item_id(item: Any) -> str:
    return str(getattr(item, "slide_id", item))


def _item_path(item: Any) -> str:
    return str(getattr(item, "path", ""))


def worker_plugin(name: str) -> Any:
    """The plugin registered under `name` for the running batch (on a dask worker: that worker's copy)."""
    try:
        from distributed import get_worker

        return get_worker().plugins[name]
    except ValueError:  # not on a dask worker: the inline batch
        pass
    plugins = _INLINE_PLUGINS.get({})
    if name not in plugins:
        raise KeyError(f"no worker plugin {name!r} registered for this batch")
    return plugins[name]


def _plugin_name(plugin: Any) -> str:
    return str(getattr(plugin, "name", None) or type(plugin).__name__)


def run_jobs(
    items: Sequence[Any],
    fn: Callable[[Any], JobResult],
    *,
    workers: int = 1,
    scheduler: str | None = None,
    desc: str = "slides",
    worker_plugin: Any = None,
    at_once: int = 1,
    progress: bool = True,
    unit: str = "items",
    labels: dict[str, str] | None = None,
) -> list[JobResult]:
    """Run `fn` on every item; return one JobResult per item in the order of `items`; `progress`: a bar.
    `unit` names what an item's `n` counts and `labels` its statuses in the closing line, in the words
    of the command's own summary ("tiles kept", ok -> "tiled"), so a log never says "items" for tiles.

    at_once: inline, run this many items at a time on threads (for work that releases the GIL, such as
    the tile stage's decoding and numpy: one item's single-threaded steps then overlap another's)."""
    items = list(items)
    if workers < 1:
        raise WsiError(f"--workers must be at least 1, got {workers}")
    start = time.perf_counter()
    if not items:
        results: list[JobResult] = []
    elif scheduler is None and (workers == 1 or len(items) == 1):  # no cluster start-up for one item
        results = _run_inline(items, fn, desc, worker_plugin, at_once, progress=progress)
    else:
        results = _run_dask(items, fn, workers, scheduler, desc, worker_plugin, progress=progress)
    summary = RunSummary.of(results, time.perf_counter() - start)
    log.info("%s", summary.line(desc, unit=unit, labels=labels))
    _log_problems(summary, desc)
    return results


def _log_problems(summary: RunSummary, desc: str) -> None:
    """Each failed or empty item with its reason, as warnings, which Python shows even where no logging
    is set up: a library call (a script's `tile_slides(...)`) is told what went wrong, as the CLI is,
    and a call in which every item failed says so in one more line."""
    for r in summary.problems:
        log.warning("%s: %s %s: %s", desc, r.slide_id, r.status, r.error or "no reason recorded")
    if summary.problems and len(summary.problems) == summary.total:
        log.error("%s: none of the %d %s(s) succeeded (reasons above, and in the rows and the manifest)",
                  desc, summary.total, _noun(desc))  # fmt: skip


def _noun(desc: str) -> str:
    """What run_jobs' items are: slides, or patients for `wsi embed-slides --level patient`."""
    return "patient" if desc == "patients" else "slide"


def _progress(total: int, desc: str, *, show: bool = True) -> Bar:
    bar: Bar = progress(total=total, desc=desc, unit=_noun(desc), leave=False, disable=not show)
    return bar


def _run_inline(
    items: list[Any], fn: Callable, desc: str, plugin: Any, at_once: int = 1, *, progress: bool = True
) -> list[JobResult]:
    plugins = {_plugin_name(plugin): plugin} if plugin is not None else {}
    token = _INLINE_PLUGINS.set(plugins)
    try:
        if plugin is not None and hasattr(plugin, "setup"):
            plugin.setup(worker=None)
        with _progress(len(items), desc, show=progress) as bar:
            if at_once > 1 and len(items) > 1:
                return _run_threads(items, fn, bar, at_once)
            results: list[JobResult] = []
            try:
                for item in items:
                    results.append(_call(fn, item))
                    bar.update()
            except KeyboardInterrupt:
                raise JobsInterrupted([*results, *[None] * (len(items) - len(results))]) from None
            return results
    finally:
        if plugin is not None and hasattr(plugin, "teardown"):
            plugin.teardown(worker=None)
        _INLINE_PLUGINS.reset(token)


def _run_threads(items: list[Any], fn: Callable, bar: Bar, at_once: int) -> list[JobResult]:
    """`_call(fn, item)` for every item on `at_once` threads (each with this batch's context: its
    plugins), at most `at_once` running; results in the order of `items`."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    results: list[JobResult | None] = [None] * len(items)
    with ThreadPoolExecutor(at_once, thread_name_prefix="job") as pool:
        running: dict[Future[JobResult], int] = {}
        try:
            for i, item in enumerate(items):
                if len(running) >= at_once:  # submit as slots free up: a later item never waits on an earlier
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        at = running.pop(future)
                        results[at] = future.result()
                        bar.update()
                context = contextvars.copy_context()
                running[pool.submit(context.run, _call, fn, item)] = i
            for future in list(running):
                at = running.pop(future)
                results[at] = future.result()
                bar.update()
        except KeyboardInterrupt:  # the items running finish (their files are whole), no new one starts
            now = sum(not f.done() for f in running)
            if now:
                log.warning("stopping: waiting for %d running item(s) to finish (Ctrl-C again: at once)", now)
            pool.shutdown(wait=True, cancel_futures=True)
            for future, i in running.items():
                if future.done() and not future.cancelled() and future.exception() is None:
                    results[i] = future.result()
            raise JobsInterrupted(results) from None
    return [r for r in results if r is not None]


def _run_dask(
    items: list[Any], fn: Callable, workers: int, scheduler: str | None, desc: str, plugin: Any,
    *, progress: bool = True,
) -> list[JobResult]:  # fmt: skip
    # a local cluster's workers, restarted too, never re-run the caller's script (pipelines.cluster)
    hidden = main_script_hidden() if scheduler is None else contextlib.nullcontext()
    with quiet_distributed(), hidden:
        return _run_dask_quietly(items, fn, workers, scheduler, desc, plugin, progress=progress)


def _run_dask_quietly(
    items: list[Any], fn: Callable, workers: int, scheduler: str | None, desc: str, plugin: Any,
    *, progress: bool = True,
) -> list[JobResult]:  # fmt: skip
    from distributed import Client, as_completed

    cluster = None
    if scheduler is None:
        cluster = start_local_cluster(min(workers, len(items)))
        try:
            client = Client(cluster)
        except BaseException:
            close_local_cluster(cluster)
            raise
    else:
        try:
            client = Client(scheduler, timeout="20s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise WsiError(
                f"cannot connect to the dask scheduler at {scheduler!r} "
                f"(expected an address like tcp://host:8786): {exc}"
            ) from exc
    try:
        if plugin is not None:
            client.register_plugin(plugin, name=_plugin_name(plugin))
        futures = client.map(_call, [fn] * len(items), items, pure=False)
        index = {future.key: i for i, future in enumerate(futures)}
        results: list[JobResult | None] = [None] * len(items)
        with _progress(len(items), desc, show=progress) as bar:
            try:
                for future in as_completed(futures):
                    i = index[future.key]
                    try:
                        results[i] = future.result()
                    except Exception as exc:  # the worker died (e.g. a crash in a slide library)
                        results[i] = JobResult(
                            _item_id(items[i]), _item_path(items[i]), "failed", error=describe_error(exc)
                        )
                    bar.update()
            except KeyboardInterrupt:  # the cluster stops below: what finished is in `results`
                raise JobsInterrupted(results) from None
        return [r for r in results if r is not None]
    finally:
        client.close()
        if cluster is not None:
            close_local_cluster(cluster)


def write_manifest(path: str | Path, results: Sequence[JobResult], *, keep_others: bool = True) -> None:
    """Write the manifest CSV atomically. With `keep_others`, rows of an existing manifest for items not
    in `results` are kept (a run over some slides does not forget the others), and so is a row that a
    new failure of the same id but another file would replace: refusing a second slide whose id is
    taken must not erase the record of the first."""
    path = Path(path)
    rows: list[JobResult] = []
    if keep_others and path.is_file():
        try:
            rows = [old for old in read_manifest(path) if not any(_supersedes(new, old) for new in results)]
        except (OSError, ValueError, KeyError):
            rows = []
    rows.extend(results)
    write_csv_atomic(
        path,
        MANIFEST_COLUMNS,
        ([r.slide_id, r.path, r.status, r.n, f"{r.seconds:.3f}", r.error, r.note] for r in rows),
    )


def _supersedes(new: JobResult, old: JobResult) -> bool:
    return new.slide_id == old.slide_id and (new.path == old.path or new.status != "failed")


def _status(value: str) -> Status:
    for status in STATUSES:
        if value == status:
            return status
    raise ValueError(f"unknown status {value!r} in a manifest")


def read_manifest(path: str | Path) -> list[JobResult]:
    with open(path, newline="", encoding="utf-8") as fh:
        return [
            JobResult(
                slide_id=row["slide"],
                path=row["path"],
                status=_status(row["status"]),
                n=int(row["tiles"] or 0),
                seconds=float(row["seconds"] or 0.0),
                error=row["error"],
                note=row.get("note") or "",  # manifests written before the column existed
            )
            for row in csv.DictReader(fh)
        ]

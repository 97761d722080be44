"""A quiet local dask.distributed cluster for batches that outgrow one process (`run_jobs(workers=N)`).

Public API:

    start_local_cluster(workers) -> distributed.LocalCluster   # the caller closes it
    close_local_cluster(cluster)     # a worker slow to exit on a loaded machine is a warning, not a failure
    quiet_distributed()              # context: dask's INFO chatter off the terminal (unless -vv)
    main_script_hidden()             # context: worker processes start without re-running the caller's script

A local cluster's workers are started by spawn, which first re-runs the parent's `__main__` script in each
new process: a plain script that calls a stage with workers > 1 at its top level (no `if __name__ ==
"__main__":`) would start a cluster inside every worker ("Nanny failed to start", lock errors). The jobs
are this package's functions, never the script's, so workers are started without it (`main_script_hidden`).
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)


@contextmanager
def quiet_distributed() -> Iterator[None]:
    """Keep dask's per-cluster INFO chatter (scheduler, nanny, worker start/stop) off the user's
    terminal unless debug logging is on; the level is restored afterwards."""
    import distributed  # noqa: F401  (importing it sets its log levels from dask's config: do it first)

    logger = logging.getLogger("distributed")
    old = logger.level
    if not log.isEnabledFor(logging.DEBUG):
        logger.setLevel(max(old, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(old)


@contextmanager
def main_script_hidden() -> Iterator[None]:
    """While it lasts, processes started by spawn do not re-run the caller's script.

    multiprocessing's spawn tells a child to import the parent's `__main__` from its module name
    (`__spec__`, `python -m`) or its file (`__file__`) (`multiprocessing.spawn.get_preparation_data`);
    with both hidden it imports nothing of it, as for `python -c` or a notebook. Restored on exit. A
    call made while a spawned child is still importing its parent's script (another library's processes
    re-running an unguarded script) cannot work, and says why."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        from wsi.core.errors import WsiError

        raise WsiError(
            "a stage with workers > 1 was called while a new process was starting: Python's spawn re-runs "
            "the script in each process it starts, and this script calls the stage at its top level; put "
            "the call under `if __name__ == \"__main__\":`, or use workers=1"
        )
    main = sys.modules.get("__main__")
    saved: dict[str, Any] = {
        k: main.__dict__[k] for k in ("__spec__", "__file__") if main is not None and k in main.__dict__
    }
    try:
        if main is not None:
            main.__spec__ = None
            main.__dict__.pop("__file__", None)
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


def start_local_cluster(workers: int) -> Any:
    """A quiet dask.distributed LocalCluster of `workers` processes, one thread each, no dashboard.

    dask starts workers with MALLOC_TRIM_THRESHOLD_=65536, which also freezes glibc's mmap threshold at
    128 KiB: every tile-sized numpy temporary then costs fresh page faults, and the tile stage measured
    2x slower in a worker than inline. Our jobs free their memory per slide, so we leave glibc's
    defaults in place. The caller closes the cluster.
    """
    import dask
    from distributed import LocalCluster

    with (
        quiet_distributed(),
        main_script_hidden(),  # the caller's script is not re-run in each worker (module docstring)
        dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}),
    ):
        return LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",  # None still binds 8787 and warns when taken
            silence_logs=logging.WARNING,
        )


def close_local_cluster(cluster: Any) -> None:
    """Close a cluster from `start_local_cluster`. On a loaded machine a worker process may take longer
    to exit than dask's nanny waits (a few seconds); the nanny then kills it and `close()` raises
    TimeoutError, after every result is in. That must not turn a finished run into a traceback (and
    lose its manifest), so it is a warning."""
    try:
        cluster.close()
    except (TimeoutError, OSError) as exc:
        log.warning(
            "dask's local cluster did not shut down in time (%s); its worker processes were stopped",
            type(exc).__name__,
        )

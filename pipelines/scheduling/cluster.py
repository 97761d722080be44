"""A quiet local dask.distributed cluster for batches that outgrow one process (`run_jobs(workers=N)`).

Public API:

    start_local_cluster(workers) -> distributed.LocalCluster   # the caller closes it
    close_local_cluster(cluster)     # a worker slow to exit on a loaded machine is a warning, not a failure
    quiet_distributed()              # context: dask's INFO chatter off the terminal (unless -vv)
"""

from __future__ import annotations

import logging
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

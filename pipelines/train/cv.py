"""Cross-validation folds on a dask.distributed cluster: one fold per task, gathered in fold order.

Each fold is `folds.run_fold(spec)`: it starts from the run's `StartState` (the initial model and the
random state right after building it) and reads nothing but its spec and the input files, so a fold
gives the same result on a worker as in the calling process. Start workers with one thread each
(`dask worker ADDRESS --nthreads 1`, one per GPU) so one worker trains one fold at a time on its own
device.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from wsi.core.errors import ConfigError
from wsi.pipelines.train.folds import FoldSpec, run_fold
from wsi.pipelines.train.results import RunMetrics

log = logging.getLogger(__name__)


def run_folds_on_cluster(specs: Sequence[FoldSpec], address: str) -> list[RunMetrics]:
    """Submit every fold to the cluster at `address`; returns each fold's metrics in fold order."""
    from distributed import Client

    try:
        client = Client(address, timeout="30s")
    except OSError as exc:
        raise ConfigError(f"cannot reach the dask scheduler at {address} ({exc}); is it running?") from None
    with client:
        n_workers = len(client.scheduler_info().get("workers", {}))
        log.info("running %d folds on %d dask worker(s) at %s", len(specs), n_workers, address)
        futures = [
            client.submit(run_fold, spec, key=f"wsi-fold-{i + 1}-{spec.run_dir}", pure=False)
            for i, spec in enumerate(specs)
        ]
        results: list[RunMetrics] = client.gather(futures)
        return results


__all__ = ["run_folds_on_cluster"]

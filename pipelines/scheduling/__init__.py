"""Where and how work runs: one job per slide inline or on dask.distributed with a manifest, remote outputs,
the compute device."""

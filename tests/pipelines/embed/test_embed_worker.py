"""A dask worker's encoder is built by the first slide job, not in the plugin's setup, which dask runs on
the worker's event loop (a 24 s build there made the worker miss its heartbeats; issue 10 item 9)."""

from __future__ import annotations

import time

from wsi.pipelines.embed import EmbedOptions
from wsi.pipelines.embed.worker import PLUGIN_NAME, EncoderPlugin
from wsi.pipelines.scheduling.jobs import worker_plugin

OPTIONS = EmbedOptions(encoder="timm:test_resnet", random_init=True, input_px=64, readers=0, threads=1)


def _state() -> tuple[bool, str]:
    """On the worker: whether the encoder exists yet; then build it the way a slide job does."""
    plugin: EncoderPlugin = worker_plugin(PLUGIN_NAME)
    built_before = plugin.runtime is not None
    with plugin.lock:
        runtime = plugin.get_runtime()
    return built_before, runtime.encoder.name


def test_setup_returns_at_once_and_the_first_task_builds_the_encoder(monkeypatch) -> None:
    from distributed import Client, LocalCluster

    import wsi.models.encoders

    calls: list[float] = []
    real_build = wsi.models.encoders.build_encoder

    def slow_build(*args, **kwargs):  # a big encoder's weights: seconds to load
        calls.append(time.perf_counter())
        time.sleep(1.0)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(wsi.models.encoders, "build_encoder", slow_build)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        # register_plugin returns once every worker's setup has returned (distributed's Worker.plugin_add
        # awaits it): had setup built the encoder, `calls` would hold it (a timing bound here would only
        # measure the machine's load)
        client.register_plugin(EncoderPlugin(OPTIONS), name=PLUGIN_NAME)
        assert not calls  # setup built nothing: the event loop stayed free
        first = client.submit(_state, pure=False).result()
        second = client.submit(_state, pure=False).result()
    assert first == (False, "timm:test_resnet")  # the first task found no encoder and built it
    assert second == (True, "timm:test_resnet") and len(calls) == 1  # built once per worker

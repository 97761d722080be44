"""`--gpus`: one embed worker per GPU (issue 12 item 5). The device arithmetic is tested on its own; the
whole path (a LocalCluster with one worker per device, every worker pinned by the plugin, several
encoders per worker) runs here with CPU devices standing in for GPUs; without CUDA `--gpus` is a usage
error."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import wsi.pipelines.embed.stage as stage
from wsi.cli.main import cli
from wsi.core.config import parse_config
from wsi.core.errors import ConfigError
from wsi.formats.bags import read_bag
from wsi.pipelines.embed import EmbedOptions, EncoderChoice, embed_tiles, results_by_encoder
from wsi.pipelines.embed.gpus import assign_gpus, worker_gpu
from wsi.pipelines.embed.worker import EncoderPlugin, worker_device
from wsi.pipelines.tile.stage import tile_slides
from wsi.slides.sources import find_slides
from wsi.tiling.params import TileParams

CHOICES = (EncoderChoice("timm:test_resnet", input_px=64), EncoderChoice("timm:test_convnext", input_px=64))
TWO = EmbedOptions(encoders=CHOICES, random_init=True, batch_size=8, readers=0, dtype="float32", threads=1)


def test_gpus_value_and_assignment() -> None:
    def gpus(value: object) -> object:
        return parse_config(EmbedOptions, {"gpus": value}, source="wsi embed options").gpus

    assert gpus("2") == 2 and gpus(" all ") == "all" and gpus(3) == 3
    for bad in ("0", "two", "-1", 1e9):
        with pytest.raises(ConfigError, match="wsi embed options: field 'gpus"):
            gpus(bad)
    assert assign_gpus(2, 4) == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert assign_gpus("all", 3) == [torch.device("cuda", i) for i in range(3)]
    with pytest.raises(ConfigError, match="only 2 CUDA GPUs"):
        assign_gpus(3, 2)
    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        assign_gpus("all", 0)


def test_each_worker_takes_its_own_gpu() -> None:
    devices = ["cuda:0", "cuda:1", "cuda:2"]
    assert [worker_gpu(k, devices, 3) for k in range(4)] == [torch.device("cuda", i) for i in (0, 1, 2, 0)]
    # a cluster of your own: a worker pinned by CUDA_VISIBLE_DEVICES sees one GPU, whatever its name
    assert worker_gpu("tcp://10.0.0.7:40123", None, 1) == torch.device("cuda", 0)
    assert worker_gpu("3", None, 4) == torch.device("cuda", 3)
    # the plugin carries the list to the workers and maps the worker's name, without touching CUDA
    plugin = pickle.loads(pickle.dumps(EncoderPlugin(TWO, devices=devices)))
    plugin.setup(worker=SimpleNamespace(name=1))
    assert plugin.device == torch.device("cuda", 1) and plugin.runtimes is None
    assert worker_device(None, SimpleNamespace(name=2), devices) == torch.device("cuda", 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_gpus_without_cuda_or_with_a_scheduler_is_a_usage_error(make_slide, tmp_path: Path) -> None:
    slide = make_slide(name="gpu-a", size_um=400.0, mpp=1.0, seed=3)
    base = ["embed", str(slide.path), "--out", str(tmp_path), "--random-init", "--readers", "0"]
    res = CliRunner().invoke(cli, [*base, "--gpus", "2"])
    assert res.exit_code == 2 and "no CUDA GPU is visible" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "tiles").exists()  # refused before the tiling started
    res = CliRunner().invoke(cli, [*base, "--gpus", "all", "--scheduler", "tcp://127.0.0.1:1"])
    assert res.exit_code == 2 and "CUDA_VISIBLE_DEVICES" in res.output
    res = CliRunner().invoke(cli, [*base, "--gpus", "2", "--workers", "2"])
    assert res.exit_code == 2 and "not both" in res.output
    res = CliRunner().invoke(cli, [*base, "--gpus", "many"])
    assert res.exit_code == 2 and "--gpus" in res.output


def test_one_worker_per_device_equals_the_local_run(
    make_slide, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make_slide(name="gpu-a", size_um=400.0, mpp=1.0, seed=3)
    b = make_slide(name="gpu-b", size_um=400.0, mpp=1.0, seed=4, style="b")
    params = TileParams(tile_um=128.0, tile_px=32, min_blur_variance=0)
    tiled = tile_slides(find_slides([a.path, b.path]), out_dir=tmp_path, params=params)
    assert [r.status for r in tiled] == ["ok", "ok"]
    local = embed_tiles(tiles_dir=tmp_path, out_dir=tmp_path / "local", options=TWO, progress=False)
    assert {r.status for r in local} == {"ok"}
    seen: list[object] = []

    def two_devices(gpus: object, available: int) -> list[torch.device]:
        seen.append(gpus)
        return [torch.device("cpu"), torch.device("cpu")]  # stand-ins for cuda:0 and cuda:1

    monkeypatch.setattr(stage, "assign_gpus", two_devices)
    options = dataclasses.replace(TWO, readers=1)
    results = embed_tiles(
        tiles_dir=tmp_path, out_dir=tmp_path / "gpus", options=options, gpus=2, progress=False
    )
    assert seen == [2]
    by_encoder = results_by_encoder(results)
    assert {eid: [(r.slide_id, r.status) for r in rows] for eid, rows in by_encoder.items()} == {
        eid: [("gpu-a", "ok"), ("gpu-b", "ok")] for eid in ("timm-test_resnet", "timm-test_convnext")
    }
    for eid in ("timm-test_resnet", "timm-test_convnext"):
        for slide_id in ("gpu-a", "gpu-b"):
            got = read_bag(tmp_path / "gpus" / "features" / eid / f"{slide_id}.h5")
            want = read_bag(tmp_path / "local" / "features" / eid / f"{slide_id}.h5")
            np.testing.assert_allclose(got.feats, want.feats, rtol=1e-4, atol=1e-5)

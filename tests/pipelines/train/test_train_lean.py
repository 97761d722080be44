"""The lean loop on small cohorts: bags held in memory (same samples, same random subsets as from
disk, no worker processes), and the resume state saved at a rate yet still resuming exactly."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from cohorts import TINY, make_cohort, write_task
from safetensors.torch import load_file

import wsi.pipelines.train.loop as loop
from wsi.pipelines.inputs import Item
from wsi.pipelines.inputs.bag_dataset import BagDataset
from wsi.pipelines.inputs.bags import BagInput
from wsi.pipelines.study.cases import make_loader
from wsi.pipelines.train import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory):
    return make_cohort(tmp_path_factory.mktemp("cohort"), n_patients=12)


def _items(cohort) -> list[Item]:
    return [Item(id=p.stem, path=p, label=i % 2) for i, p in enumerate(sorted(cohort.bags.glob("*.h5")))]


def test_preloaded_bags_give_the_samples_and_random_subsets_read_from_disk(cohort) -> None:
    items = _items(cohort)
    disk, memory = BagDataset(items, bag_size=5), BagDataset(items, bag_size=5)
    assert memory.preload(10**9) and memory.cache is not None and len(memory.cache) == len(items)
    for i in range(len(items)):
        torch.manual_seed(i)
        a = disk[i]
        torch.manual_seed(i)
        b = memory[i]
        assert a.keys() == b.keys() and a["id"] == b["id"]
        assert a["x"].shape[0] == min(5, len(memory.cache[i]["x"]))
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["coords_um"], b["coords_um"])
    whole = BagDataset(items, bag_size=None)
    assert whole.preload(10**9)
    assert torch.equal(whole[0]["x"], BagDataset(items, bag_size=None)[0]["x"])


def test_a_cohort_over_the_limit_stays_on_disk_and_keeps_its_workers(cohort) -> None:
    items = _items(cohort)
    big = BagDataset(items, bag_size=None)
    assert not big.preload(100) and big.cache is None  # nothing read
    args = {"train": True, "batch_size": 1, "num_workers": 2, "device": torch.device("cpu"), "n_targets": 1}
    assert make_loader(BagInput(), items, preload_bytes=100, **args).num_workers == 2
    small = make_loader(BagInput(), items, preload_bytes=10**9, **args)
    assert small.num_workers == 0  # in memory: no worker process spawned per epoch


@pytest.mark.slow  # ~20-45 s on 2 shared cores: two 6-epoch runs and a resumed one
def test_state_saved_at_a_rate_still_resumes_to_the_same_weights(
    cohort, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "STATE_EVERY_S", 1e9)  # saved only when the best epoch changes, and at the end
    task = write_task(
        tmp_path / "task.yaml", epochs=6, patience=0, input_options={"bag_size": 10},
        model={"preset": "vit-wsi", "attention": "seqnorm", "overrides": {**TINY, "dropout": 0.2}},
    )  # fmt: skip

    def run(out: Path, **kw):
        return train(task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=out,
                     progress=False, **kw)  # fmt: skip

    whole = run(tmp_path / "whole")

    class Crash(Exception):
        pass

    def crash_after_epoch_5(row: dict) -> None:
        if row["epoch"] == 5:
            raise Crash

    with pytest.raises(Crash):
        run(tmp_path / "cut", on_epoch_end=crash_after_epoch_5)
    saved = len(list(csv.DictReader((tmp_path / "cut" / "log.csv").open())))
    progress = json.loads((tmp_path / "cut" / "resume" / "state.json").read_text())["progress"]
    assert progress["epoch"] == saved == progress["best_epoch"]  # last saved when the best changed
    assert load_file(tmp_path / "cut" / "best.safetensors")
    seen: list[dict] = []
    run(tmp_path / "cut", resume=True, on_epoch_end=seen.append)
    assert [r["epoch"] for r in seen] == list(range(saved + 1, 7))  # re-ran the epochs after the save
    a, b = (load_file(tmp_path / d / "last.safetensors") for d in ("whole", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    a, b = (load_file(tmp_path / d / "best.safetensors") for d in ("whole", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    log_a, log_b = ([r["train_loss"] for r in csv.DictReader((d / "log.csv").open())] for d in
                    (tmp_path / "whole", tmp_path / "cut"))  # fmt: skip
    assert log_a == log_b and len(log_a) == 6
    assert (tmp_path / "cut" / "metrics.json").is_file() and whole.metrics["epochs_run"] == 6

"""Training: every attention variant learns, resume is exact, cross-validation (also on dask), CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from cohorts import IN_DIM, TINY, make_cohort, write_task
from safetensors.torch import load_file

from wsi.cli.main import cli
from wsi.core.errors import ConfigError
from wsi.models import build_model
from wsi.models.presets import build_model_from_config
from wsi.pipelines.scheduling.devices import resolve_device as pick_device
from wsi.pipelines.study.tasks import load_task
from wsi.pipelines.train import train
from wsi.pipelines.train.folds import init_from


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory):
    return make_cohort(tmp_path_factory.mktemp("cohort"), n_patients=24)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _train(cohort, task: Path, out: Path, **kw):
    return train(
        task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=out, progress=False, **kw
    )


@pytest.mark.parametrize("attention", ["seqnorm", "softmax", "sima", "gdla"])
def test_each_attention_variant_learns_separable_bags(cohort, tmp_path: Path, attention: str) -> None:
    task = write_task(tmp_path / "task.yaml")
    result = _train(cohort, task, tmp_path / "run", attention=attention)
    run = result.run_dir
    log_rows = list(csv.DictReader((run / "log.csv").open()))
    assert max(float(r["val_auroc"]) for r in log_rows) >= 0.95
    assert result.metrics["best_val_auroc"] >= 0.95
    assert set(log_rows[0]) == {
        "epoch",
        "train_loss",
        "val_loss",
        "val_auroc",
        "val_accuracy",
        "lr",
        "seconds",
        "peak_mem_mb",
    }
    assert float(log_rows[-1]["train_loss"]) < float(log_rows[0]["train_loss"])
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["split"] == "test" and metrics["auroc"] >= 0.9
    lo, hi = metrics["auroc_ci95"]
    if "auroc_ci95" in metrics.get("not_estimable", {}):  # a small test split: no interval, said why
        assert lo is None and "too few cases per class" in metrics["not_estimable"]["auroc_ci95"]
    else:
        assert lo <= metrics["auroc"] <= hi
    assert np.array(metrics["confusion_matrix"]).sum() == metrics["n"]
    assert (run / "roc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((run / "config.json").read_text())
    assert config["task"]["model"]["attention"] == attention
    assert config["model"]["attention"] == attention and config["model"]["in_dim"] == IN_DIM
    prov = config["input"]["provenance"]
    assert prov["encoder"] == "test-encoder" and prov["weights_sha256"] == "0" * 64
    assert prov["tile_size_um"] == 256.0 and prov["tile_params"] == {"tile_um": 256.0, "tile_px": 256}
    for name in ("best.safetensors", "last.safetensors"):
        assert load_file(run / name)  # plain safetensors tensors


def test_resume_reaches_the_same_weights_as_an_uninterrupted_run(cohort, tmp_path: Path) -> None:
    # random bag subsampling and dropout make the RNG state matter; cosine makes the scheduler matter
    task = write_task(
        tmp_path / "task.yaml",
        epochs=5,
        patience=0,
        input_options={"bag_size": 10},
        model={"preset": "vit-wsi", "attention": "seqnorm", "overrides": {**TINY, "dropout": 0.2}},
    )
    whole = _train(cohort, task, tmp_path / "whole")

    class Crash(Exception):
        pass

    def crash_after_epoch_2(row: dict) -> None:
        if row["epoch"] == 2:
            raise Crash

    with pytest.raises(Crash):
        _train(cohort, task, tmp_path / "cut", on_epoch_end=crash_after_epoch_2)
    assert len(list(csv.DictReader((tmp_path / "cut" / "log.csv").open()))) == 2
    with pytest.raises(ConfigError, match="--resume"):
        _train(cohort, task, tmp_path / "cut")
    seen: list[dict] = []
    resumed = _train(cohort, task, tmp_path / "cut", resume=True, on_epoch_end=seen.append)
    assert [r["epoch"] for r in seen] == [3, 4, 5]  # continued after epoch 2, did not start over

    a, b = (
        load_file(tmp_path / "whole" / "last.safetensors"),
        load_file(tmp_path / "cut" / "last.safetensors"),
    )
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    log_a = [r["train_loss"] for r in csv.DictReader((tmp_path / "whole" / "log.csv").open())]
    log_b = [r["train_loss"] for r in csv.DictReader((tmp_path / "cut" / "log.csv").open())]
    assert log_a == log_b and len(log_a) == 5
    assert resumed.metrics["auroc"] == whole.metrics["auroc"]


def test_resume_refuses_a_changed_task(cohort, tmp_path: Path) -> None:
    task = write_task(tmp_path / "task.yaml", epochs=1)
    _train(cohort, task, tmp_path / "run")
    with pytest.raises(ConfigError, match=r"holds a finished training run .*\); give another --out"):
        _train(cohort, task, tmp_path / "run")  # the same call again: done, not "use --resume"
    with pytest.raises(ConfigError, match="cannot resume"):
        _train(cohort, task, tmp_path / "run", resume=True, seed=99)


def test_cross_validation_folds_are_patient_disjoint(cohort, tmp_path: Path) -> None:
    task = write_task(tmp_path / "task.yaml", epochs=3, patience=0)
    result = _train(cohort, task, tmp_path / "cv", cv=3)
    summary = json.loads((tmp_path / "cv" / "metrics.json").read_text())
    assert summary["folds"] == 3 and len(summary["per_fold"]) == 3
    aucs = [f["auroc"] for f in summary["per_fold"]]
    assert summary["auroc"]["mean"] == pytest.approx(np.mean(aucs))
    assert summary["auroc"]["std"] == pytest.approx(np.std(aucs, ddof=1))
    tested: list[str] = []
    for k in (1, 2, 3):
        rows = list(csv.DictReader((tmp_path / "cv" / f"fold-{k}" / "splits.csv").open()))
        parts: dict[str, set[str]] = {}
        for r in rows:
            parts.setdefault(cohort.patient_of[r["slide"]], set()).add(r["split"])
        assert all(len(p) == 1 for p in parts.values())  # no patient in two parts of a fold
        tested += [r["slide"] for r in rows if r["split"] == "test"]
        assert (tmp_path / "cv" / f"fold-{k}" / "best.safetensors").is_file()
    assert sorted(tested) == sorted(cohort.slides)  # every slide tested exactly once
    assert len(result.folds) == 3

    # predicting with the CV run folder averages its folds' probabilities
    from wsi.pipelines.predict.stage import predict

    kw = {"features_dir": cohort.bags, "heatmaps": False, "progress": False}
    ensemble = predict(model_dir=tmp_path / "cv", out_dir=tmp_path / "p", **kw).rows
    folds = [
        predict(model_dir=f.run_dir, out_dir=tmp_path / f"p{i}", **kw).rows
        for i, f in enumerate(result.folds)
    ]
    for i, row in enumerate(ensemble):
        assert row["prob_LUSC"] == pytest.approx(np.mean([f[i]["prob_LUSC"] for f in folds]), abs=1e-6)


def test_cv_logs_each_fold_as_k_of_k(cohort, tmp_path: Path) -> None:
    """`wsi train --cv 5` says which fold it is on ("fold 1/5" ... "fold 5/5") before each fold's
    training and on each fold's test line, so five test lines are told apart."""
    task = write_task(tmp_path / "task.yaml", epochs=1, patience=0)
    args = ["train", "--task", str(task), "--features", str(cohort.bags), "--labels", str(cohort.labels),
            "--out", str(tmp_path / "cv"), "--cv", "5", "--no-progress"]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for k in range(1, 6):
        assert any(f"fold {k}/5: training on " in line for line in lines), (k, res.output)
        assert any(f"fold {k}/5: test AUROC" in line for line in lines), (k, res.output)
    assert "fold 6/5" not in res.output and "fold 0/5" not in res.output


@pytest.mark.slow
def test_cross_validation_on_dask_equals_sequential(cohort, tmp_path: Path) -> None:
    from distributed import Client

    from wsi.pipelines.scheduling.cluster import close_local_cluster, start_local_cluster

    task = write_task(tmp_path / "task.yaml", epochs=2, patience=0)
    seq = _train(cohort, task, tmp_path / "seq", cv=2)
    cluster = start_local_cluster(2)  # two processes, one thread each
    try:
        with Client(cluster):
            par = _train(cohort, task, tmp_path / "par", cv=2, scheduler=cluster.scheduler_address)
    finally:
        close_local_cluster(cluster)  # a worker slow to exit on a loaded machine is not this test's failure
    for fs, fp in zip(seq.metrics["per_fold"], par.metrics["per_fold"], strict=True):
        assert fs["auroc"] == pytest.approx(fp["auroc"], abs=1e-9)
        assert fs["confusion_matrix"] == fp["confusion_matrix"]
    for k in (1, 2):
        a = np.loadtxt(
            tmp_path / "seq" / f"fold-{k}" / "test_predictions.csv", delimiter=",", skiprows=1, usecols=(2, 3)
        )
        b = np.loadtxt(
            tmp_path / "par" / f"fold-{k}" / "test_predictions.csv", delimiter=",", skiprows=1, usecols=(2, 3)
        )
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_init_from_softmax_transfers_weights(cohort, tmp_path: Path) -> None:
    task = write_task(tmp_path / "task.yaml", epochs=2, patience=0)
    _train(cohort, task, tmp_path / "softmax", attention="softmax")
    architecture = json.loads((tmp_path / "softmax" / "config.json").read_text())["model"]
    model = build_model_from_config({**architecture, "attention": "seqnorm"})
    init_from(model, tmp_path / "softmax", "seqnorm")
    source = load_file(tmp_path / "softmax" / "best.safetensors")
    state = model.state_dict()
    shared = [k for k in source if k in state]
    dropped = [k for k in source if k.endswith("attn.to_qkv.bias")]  # cancel in seqnorm, which has none
    assert len(shared) == len(source) - len(dropped) and all(k not in state for k in dropped)
    for k in shared:
        assert torch.equal(state[k], source[k]), k
    result = _train(cohort, task, tmp_path / "seqnorm", init_from=tmp_path / "softmax")
    assert json.loads((result.config_path).read_text())["init_from"].endswith("softmax")


def test_padded_batches_and_gradient_accumulation(cohort, tmp_path: Path) -> None:
    task = write_task(tmp_path / "task.yaml", epochs=5, batch_size=4, grad_accum=2, num_workers=1)
    result = _train(cohort, task, tmp_path / "run")
    assert result.metrics["best_val_auroc"] >= 0.95


def test_device_choice() -> None:
    assert pick_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert pick_device("auto").type in ("cpu", "mps")
        with pytest.raises(ConfigError, match="CUDA is not available"):
            pick_device("cuda")
    with pytest.raises(ConfigError, match="unknown device"):
        pick_device("tpu9")


def test_packaged_task_matches_the_issue() -> None:
    task = load_task("nsclc-subtype")
    assert task.classes == ("LUAD", "LUSC") and task.input == "bags"
    assert task.model.preset == "vit-wsi" and task.model.attention == "seqnorm"
    assert (task.optimizer.name, task.optimizer.lr, task.optimizer.weight_decay) == ("adamw", 1e-4, 1e-2)
    assert task.epochs == 100 and task.batch_size == 1 and task.input_options.get("bag_size") is None
    assert (task.split.train, task.split.val, task.split.test) == (0.60, 0.14, 0.26)
    model = build_model("vit-wsi", attention="seqnorm", num_classes=2, in_dim=2048)
    assert model(torch.randn(1, 5, 2048)).shape == (1, 2)


def test_task_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown field 'learning_rate'"):
        load_task(write_task(tmp_path / "a.yaml", learning_rate=1))
    with pytest.raises(ConfigError, match=r"optimizer\.lr"):
        load_task(write_task(tmp_path / "b.yaml", optimizer={"lr": "fast"}))
    with pytest.raises(ConfigError, match="sum to 1"):
        load_task(write_task(tmp_path / "c.yaml", split={"train": 0.5, "val": 0.1, "test": 0.1}))
    with pytest.raises(ConfigError, match="unknown task"):
        load_task("no-such-task")


def test_cli_train_and_errors(cohort, tmp_path: Path) -> None:
    task = write_task(tmp_path / "task.yaml", epochs=3)
    runner = CliRunner()
    args = ["train", "--task", str(task), "--features", str(cohort.bags), "--labels", str(cohort.labels)]
    res = runner.invoke(cli, [*args, "--out", str(tmp_path / "run"), "--no-progress", "--attention", "sima"])
    assert res.exit_code == 0, res.output
    assert "test AUROC" in res.output and (tmp_path / "run" / "metrics.json").is_file()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["task"]["model"]["attention"] == "sima"
    bad = tmp_path / "bad.csv"
    bad.write_text("slide,label\nx1,LUAD\nx2,ADENO\n")
    res = runner.invoke(
        cli,
        [
            "train",
            "--task",
            str(task),
            "--features",
            str(cohort.bags),
            "--labels",
            str(bad),
            "--out",
            str(tmp_path / "bad"),
        ],
    )
    assert res.exit_code == 2 and "row 3" in res.output and "ADENO" in res.output
    res = runner.invoke(cli, ["train", "--help"])
    assert res.exit_code == 0 and "Examples:" in res.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_training(cohort, tmp_path: Path) -> None:
    task = write_task(tmp_path / "task.yaml", epochs=4)
    result = _train(cohort, task, tmp_path / "run", device="cuda")
    config = json.loads(result.config_path.read_text())
    assert config["amp"] == "bf16" and result.metrics["best_val_auroc"] >= 0.95


def test_stamp_bags_train_and_predict(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Bags written by STAMP (feats + coords in um, no encoder digest) go through the same loader."""
    import h5py

    from wsi.pipelines.predict.stage import predict

    rng = np.random.default_rng(0)
    bags = tmp_path / "stamp"
    bags.mkdir()
    rows = ["FILENAME,PATIENT,label"]
    for i in range(12):
        label = i % 2
        feats = rng.normal(size=(10, IN_DIM)).astype(np.float32)
        feats[:, :4] += 1.5 if label else -1.5
        with h5py.File(bags / f"case{i}.h5", "w") as h5:
            h5["feats"] = feats
            h5["coords"] = (rng.integers(0, 10, (10, 2)) * 224.0).astype(np.float32)
            h5.attrs["tile_size_um"] = 224.0
            h5.attrs["unit"] = "um"
            h5.attrs["extractor"] = "ctranspath"
        rows.append(f"case{i}.svs,pat{i},{('LUAD', 'LUSC')[label]}")
    labels = tmp_path / "clini.csv"
    labels.write_text("\n".join(rows) + "\n")
    task = write_task(tmp_path / "task.yaml", epochs=3)
    result = train(task=task, labels_csv=labels, features_dir=bags, out_dir=tmp_path / "run", progress=False)
    assert result.metrics["n"] > 0
    with caplog.at_level("WARNING"):
        pred = predict(model_dir=tmp_path / "run", features_dir=bags, out_dir=tmp_path / "p", progress=False)
    assert len(pred.rows) == 12 and "cannot verify" in caplog.text


def test_every_fold_starts_as_if_it_seeded_and_built_its_own_model() -> None:
    """The run builds one model; each fold's copy has the weights and random stream that seeding and
    building inside the fold gives (what a dask worker and a resumed run rely on)."""
    from wsi.pipelines.study.kinds import build_kind
    from wsi.pipelines.train.folds import StartState, model_kwargs
    from wsi.pipelines.train.state import seed_everything

    task = load_task("nsclc-subtype").replace(**{"model.overrides": dict(TINY), "seed": 3})
    kwargs = model_kwargs(task, build_kind(task).num_outputs, {"in_dim": IN_DIM})
    start = StartState.build(kwargs, seed=task.seed)
    torch.rand(7)  # the caller's own use of the generators in between does not leak into a fold
    folds = [start.begin() for _ in range(2)]
    after_begin = torch.rand(3)
    seed_everything(task.seed)
    own = build_model(kwargs.pop("preset"), **kwargs)
    assert torch.equal(after_begin, torch.rand(3))
    for fold in folds:
        assert fold is not start.model
        for (name, a), b in zip(fold.state_dict().items(), own.state_dict().values(), strict=True):
            assert torch.equal(a, b), name

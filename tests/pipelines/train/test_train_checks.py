"""`wsi train` refuses what would train a meaningless model, before or while training (issue 10).

Bad bags (NaN / infinite features, unreadable, empty) are all named in one refusal before anything is
written; a loss or gradient that turns NaN stops the run naming the bags of that step; bags in level-0
pixels (CLAM) get their resolution from --mpp or an `mpp` column, and only a model that uses tile
positions needs one; a test split too small for an AUROC draws no empty ROC plot; outputs honour the
umask; a --out that cannot be written is refused at once.
"""

from __future__ import annotations

import csv
import json
import os
import stat
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from cohorts import TINY, make_cohort, write_task
from peer_bags import write_cohort

import wsi.pipelines.inputs.bag_dataset as bag_input
from wsi.cli.main import cli
from wsi.pipelines.train import train
from wsi.pipelines.train.finite import NonFiniteTrainingError, check_outputs

POSITIONS = {"preset": "vit-wsi", "attention": "seqnorm", "overrides": {**TINY, "pos_encoding": True}}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _train_cli(task: Path, bags: Path, labels: Path, out: Path, *extra: str):
    args = ["train", "--task", str(task), "--features", str(bags), "--labels", str(labels), "--out", str(out)]
    return CliRunner().invoke(cli, [*args, "--no-progress", *extra])


# ------------------------------------------------------------------------------------------ bad bags
@pytest.mark.parametrize("cv", [None, "2"])
def test_every_non_finite_bag_is_named_and_nothing_is_trained(tmp_path: Path, cv: str | None) -> None:
    cohort = make_cohort(tmp_path, n_patients=8)
    nan_a, inf_b = cohort.slides[1], cohort.slides[4]
    with h5py.File(cohort.bags / f"{nan_a}.h5", "a") as h5:
        h5["feats"][0, 3] = np.nan
    with h5py.File(cohort.bags / f"{inf_b}.h5", "a") as h5:
        h5["feats"][2, 0] = np.inf
        h5["feats"][3, 1] = np.nan
    task = write_task(tmp_path / "task.yaml", epochs=1)
    run = tmp_path / "run"
    res = _train_cli(task, cohort.bags, cohort.labels, run, *(["--cv", cv] if cv else []))
    # exit 2: an input error found before any work started (the `@user_errors` code), not a failed run
    assert res.exit_code == 2, res.output
    assert f"{nan_a}.h5: 1 of" in res.output and f"{inf_b}.h5: 2 of" in res.output
    assert "2 of the" in res.output and "nothing was trained" in res.output
    assert not (run / "config.json").exists() and not list(run.rglob("*.safetensors"))


def test_a_nan_loss_stops_training_naming_the_bag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wsi.pipelines.train.passes as train_pass

    cohort = make_cohort(tmp_path, n_patients=6)
    forward = train_pass._forward
    hit: list[str] = []  # the one training bag made to give NaN: the first one seen

    def nan_for_one_bag(model, batch):
        logits = forward(model, batch)
        if model.training:
            hit.append(batch.ids[0])
            if len(hit) == 1:
                return logits * torch.nan
        return logits

    monkeypatch.setattr(train_pass, "_forward", nan_for_one_bag)
    with pytest.raises(NonFiniteTrainingError, match=r"the loss is NaN or infinite on bag\(s\) ") as err:
        train(
            task=write_task(tmp_path / "task.yaml", epochs=2), labels_csv=cohort.labels,
            features_dir=cohort.bags, out_dir=tmp_path / "run", progress=False,
        )  # fmt: skip
    assert str(err.value).split("bag(s) ")[1].startswith(f"{hit[0]};")  # that bag, and only it
    assert len(hit) == 1  # stopped at once (on the CPU the flags are read every step)
    assert not (tmp_path / "run" / "best.safetensors").exists()  # stopped inside the first epoch


def test_a_nan_gradient_stops_training_naming_the_bag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wsi.pipelines.train.passes as train_pass

    cohort = make_cohort(tmp_path, n_patients=6)
    group_loss = train_pass._group_loss
    hit: list[str] = []

    def nan_gradient(pending, kind, class_weights):
        loss = group_loss(pending, kind, class_weights)
        hit.extend(i for _, b in pending for i in b.ids)
        if len(hit) == 2:
            loss = loss + torch.sqrt(pending[0][0].sum() * 0.0)  # adds 0; d sqrt(u)/du at 0 = inf, * 0 = NaN
        return loss

    monkeypatch.setattr(train_pass, "_group_loss", nan_gradient)
    with pytest.raises(NonFiniteTrainingError, match=r"the gradient is NaN or infinite on bag\(s\) ") as err:
        train(
            task=write_task(tmp_path / "task.yaml", epochs=1), labels_csv=cohort.labels,
            features_dir=cohort.bags, out_dir=tmp_path / "run", progress=False,
        )  # fmt: skip
    assert str(err.value).split("bag(s) ")[1].startswith(f"{hit[1]};")


def test_the_cli_reports_a_diverged_run_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wsi.pipelines.train.passes as train_pass

    cohort = make_cohort(tmp_path, n_patients=6)
    forward = train_pass._forward
    monkeypatch.setattr(train_pass, "_forward", lambda model, batch: forward(model, batch) * torch.nan)
    res = _train_cli(write_task(tmp_path / "t.yaml", epochs=1), cohort.bags, cohort.labels, tmp_path / "r")
    assert res.exit_code == 2 and "training stopped" in res.output and "Traceback" not in res.output


def test_on_an_accelerator_the_flags_are_read_every_few_steps_and_at_the_end() -> None:
    """No host synchronisation per step on CUDA: a NaN is found at the next read, still by its bags."""
    from wsi.pipelines.train.finite import CUDA_CHECK_EVERY, FiniteWatch

    watch = FiniteWatch(torch.device("cuda"), epoch_desc="epoch 3")  # only its type is read
    for step in range(CUDA_CHECK_EVERY - 1):
        watch.loss(torch.tensor(torch.nan if step == 4 else 1.0), [f"bag{step}"])
        watch.gradient(torch.tensor(1.0))  # not read yet: no error
    watch.loss(torch.tensor(1.0), ["last"])
    with pytest.raises(
        NonFiniteTrainingError, match=r"in epoch 3: the loss is NaN or infinite on bag\(s\) bag4;"
    ):
        watch.gradient(torch.tensor(1.0))  # the CUDA_CHECK_EVERY-th step reads them
    watch = FiniteWatch(torch.device("cuda"))
    watch.loss(torch.tensor(2.0), ["a", "b"])
    watch.gradient(torch.tensor(torch.inf))
    with pytest.raises(NonFiniteTrainingError, match=r"the gradient is NaN or infinite on bag\(s\) a, b;"):
        watch.check()  # the end of the epoch reads the rest


def test_no_class_or_figure_comes_from_a_nan_output() -> None:
    check_outputs(["a", "b"], np.array([[0.3, 0.7], [0.6, 0.4]]))
    with pytest.raises(NonFiniteTrainingError, match=r"case\(s\) b\b"):
        check_outputs(["a", "b"], np.array([[0.3, 0.7], [np.nan, np.nan]]))
    from wsi.pipelines.study.kinds import build_kind
    from wsi.pipelines.study.tasks import load_task

    kind = build_kind(load_task("nsclc-subtype"))
    assert kind.derived_cells(np.array([np.nan, np.nan])) == [""]  # argmax of NaN would say a class
    assert kind.derived_cells(np.array([0.2, 0.8])) == ["LUSC"]


# --------------------------------------------------------------------------- CLAM bags and --mpp
def _spy_mpps(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[float | None]]:
    """Record the mpp every bag is loaded with by the bag input."""
    seen: dict[str, set[float | None]] = {}
    load = bag_input.read_bag

    def spy(path, *, mpp=None, rows=None, require_um=True):
        seen.setdefault(Path(path).stem, set()).add(mpp)
        return load(path, mpp=mpp, rows=rows, require_um=require_um)

    monkeypatch.setattr(bag_input, "read_bag", spy)
    return seen


def test_clam_bags_train_and_predict_with_mpp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bags, labels = write_cohort(tmp_path, "clam", n_slides=8)
    task = write_task(tmp_path / "task.yaml", epochs=1, model=POSITIONS)
    run = tmp_path / "run"
    seen = _spy_mpps(monkeypatch)
    res = _train_cli(task, bags, labels, run, "--mpp", "0.5")
    assert res.exit_code == 0, res.output
    assert json.loads((run / "config.json").read_text())["input"]["mpp"] == 0.5  # recorded
    assert set().union(*seen.values()) == {0.5}
    seen.clear()
    out = tmp_path / "preds"
    res = CliRunner().invoke(
        cli, ["predict", "--model", str(run), "--features", str(bags), "--out", str(out), "--no-progress"]
    )  # the run's mpp, as recorded
    assert res.exit_code == 0, res.output
    assert set().union(*seen.values()) == {0.5} and len(seen) == 8
    rows = list(csv.DictReader((out / "predictions.csv").open()))
    assert len(rows) == 8 and all(np.isfinite(float(r["prob_LUAD"])) for r in rows)
    seen.clear()
    res = CliRunner().invoke(
        cli, ["predict", "--model", str(run), "--features", str(bags), "--out", str(tmp_path / "p2"),
              "--mpp", "0.25", "--no-progress", "--no-heatmaps"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert set().union(*seen.values()) == {0.25}  # --mpp at predict time wins over the record's
    seen.clear()
    table = tmp_path / "external.csv"
    table.write_text("slide,label,mpp\nslide-00,LUAD,0.3\nslide-01,LUSC,\n")
    res = CliRunner().invoke(
        cli, ["predict", "--model", str(run), "--features", str(bags), "--out", str(tmp_path / "p3"),
              "--mpp", "0.25", "--labels", str(table), "--no-progress", "--no-heatmaps"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert seen["slide-00"] == {0.3} and seen["slide-01"] == {0.25}  # the column wins per slide


def test_clam_bags_without_mpp_are_refused_for_a_model_with_positions(tmp_path: Path) -> None:
    bags, labels = write_cohort(tmp_path, "clam", n_slides=6)
    task = write_task(tmp_path / "task.yaml", epochs=1, model=POSITIONS)
    res = _train_cli(task, bags, labels, tmp_path / "run")
    assert res.exit_code == 2, res.output
    assert "slide-00.h5" in res.output and "slide-05.h5" in res.output  # every bag, by name
    assert "--mpp" in res.output and "`mpp` column" in res.output
    assert not (tmp_path / "run" / "config.json").exists()


def test_clam_bags_train_without_mpp_when_the_model_uses_no_positions(tmp_path: Path) -> None:
    bags, labels = write_cohort(tmp_path, "clam", n_slides=6)
    task = write_task(tmp_path / "task.yaml", epochs=1)  # vit-wsi: pos_encoding off by default
    res = _train_cli(task, bags, labels, tmp_path / "run")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "run" / "config.json").read_text())["input"]["mpp"] is None


def test_an_mpp_column_wins_per_slide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bags, labels = write_cohort(tmp_path, "clam", n_slides=6)
    rows = list(csv.reader(labels.open()))
    rows[0].append("mpp")
    for row in rows[1:]:
        row.append("0.25" if row[0] in ("slide-00", "slide-03") else "")  # blank: the run-wide --mpp
    with labels.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    task = write_task(tmp_path / "task.yaml", epochs=1, model=POSITIONS)
    seen = _spy_mpps(monkeypatch)
    res = _train_cli(task, bags, labels, tmp_path / "run", "--mpp", "0.5")
    assert res.exit_code == 0, res.output
    assert seen["slide-00"] == seen["slide-03"] == {0.25}
    assert all(seen[f"slide-{k:02d}"] == {0.5} for k in (1, 2, 4, 5))
    record = json.loads((tmp_path / "run" / "config.json").read_text())["input"]
    assert record["mpp_by_slide"] == {"slide-00": 0.25, "slide-03": 0.25} and record["mpp"] == 0.5
    bad = tmp_path / "bad.csv"
    bad.write_text("slide,label,mpp\nslide-00,LUAD,-1\nslide-01,LUSC,fast\n")
    res = _train_cli(task, bags, bad, tmp_path / "run2")
    assert res.exit_code == 2 and "row 2" in res.output and "row 3" in res.output and "mpp" in res.output


# --------------------------------------------------------------------------- figures and files
def test_a_one_class_test_split_draws_no_roc_and_leaks_no_warning(tmp_path: Path) -> None:
    """5 patients (3 of one class, 2 of the other) split 1/1/1 per class: the test split holds one class."""
    cohort = make_cohort(tmp_path, n_patients=5)
    task = write_task(tmp_path / "task.yaml", epochs=1, split={"train": 0.34, "val": 0.33, "test": 0.33})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(
            task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=tmp_path / "run",
            progress=False,
        )  # fmt: skip
    assert result.metrics["split"] == "test" and result.metrics["auroc"] is None
    assert not (tmp_path / "run" / "roc.png").exists()
    leaked = [
        w
        for w in caught
        if "matplotlib" in w.filename or "sklearn" in w.filename or "legend" in str(w.message)
    ]
    assert not leaked, [str(w.message) for w in leaked]
    assert (tmp_path / "run" / "report.html").is_file()


def test_outputs_honour_the_umask(tmp_path: Path) -> None:
    """Checkpoints, the resume state and every other output: 0666 & ~umask (safetensors makes 0600)."""
    from wsi.core.files import atomic_path, write_text_atomic
    from wsi.pipelines.runs.checkpoints import save_weights

    before = os.umask(0o022)
    try:
        save_weights(torch.nn.Linear(2, 2), tmp_path / "a.safetensors")
        write_text_atomic(tmp_path / "a.txt", "x")
        with atomic_path(tmp_path / "state") as folder:  # a folder of files, as the resume state
            folder.mkdir()
            save_weights(torch.nn.Linear(2, 2), folder / "model.safetensors")
        os.umask(0o027)
        save_weights(torch.nn.Linear(2, 2), tmp_path / "b.safetensors")
    finally:
        os.umask(before)
    mode = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*") if p.is_file()}
    assert mode == {
        "a.safetensors": 0o644,
        "a.txt": 0o644,
        "model.safetensors": 0o644,
        "b.safetensors": 0o640,
    }


def test_an_out_folder_that_cannot_be_written_is_refused_at_once(tmp_path: Path) -> None:
    cohort = make_cohort(tmp_path, n_patients=4)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    task = write_task(tmp_path / "task.yaml", epochs=1)
    res = _train_cli(task, cohort.bags, cohort.labels, blocker / "run")
    assert res.exit_code == 2 and "--out" in res.output and "a-file is a file" in res.output
    assert "Traceback" not in res.output

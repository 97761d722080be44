"""Training and predicting every task kind on generated cohorts whose truth is known (kinds_cohorts):
survival against an oracle Cox model, regression against the known function, multi-target with
missing labels, patient-level bags never split, external validation with the same report."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from cohorts import TINY, make_cohort
from kinds_cohorts import make_kind_cohort, write_kind_task

from wsi.cli.main import cli
from wsi.pipelines.predict.stage import predict
from wsi.pipelines.stats.regression import pearson_r
from wsi.pipelines.stats.survival import concordance_index
from wsi.pipelines.train import train

PNG = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def survival_run(tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("survival")
    cohort = make_kind_cohort(root, kind="survival", n_patients=200, seed=1)
    task = write_kind_task(root / "task.yaml", "survival", epochs=12)
    result = train(
        task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=root / "run", progress=False
    )
    return cohort, result


def test_survival_model_reaches_the_oracle_c_index(survival_run) -> None:
    """Times come from a Cox model on the fraction of texture B; an oracle Cox model fitted on the
    training patients' true fractions sets the bar on the same test patients."""
    pytest.importorskip("lifelines", reason="lifelines is a test dependency (pip install -e '.[dev]')")
    from lifelines import CoxPHFitter

    pd = pytest.importorskip("pandas")
    cohort, result = survival_run
    run = result.run_dir
    split_of = {r["slide"]: r["split"] for r in _rows(run / "splits.csv")}
    patient_of = {s: p for p, slides in cohort.slides_of.items() for s in slides}
    label = {r["slide"]: (float(r["os_months"]), int(r["os_event"])) for r in cohort.rows}
    train_ids = [s for s, part in split_of.items() if part == "train"]
    frame = pd.DataFrame(
        {"f": [cohort.fraction[patient_of[s]] for s in train_ids], "t": [label[s][0] for s in train_ids],
         "e": [label[s][1] for s in train_ids]}
    )  # fmt: skip
    beta = float(CoxPHFitter().fit(frame, duration_col="t", event_col="e").params_["f"])
    assert beta > 1.0  # the oracle finds the hazard the cohort was drawn from (BETA = 4)

    test = _rows(run / "test_predictions.csv")
    time = np.array([float(r["os_months"]) for r in test])
    event = np.array([int(r["os_event"]) for r in test])
    oracle = concordance_index(
        time, event, beta * np.array([cohort.fraction[patient_of[r["slide"]]] for r in test])
    )
    model = concordance_index(time, event, np.array([float(r["risk"]) for r in test]))
    metrics = result.metrics
    assert metrics["c_index"] == pytest.approx(model)
    assert oracle > 0.6 and model >= 0.9 * oracle, (model, oracle)
    lo, hi = metrics["c_index_ci95"]
    assert lo <= metrics["c_index"] <= hi and len(metrics["td_auc"]) >= 1
    assert metrics["logrank_p"] is not None and metrics["n_high_risk"] == sum(
        r["risk_group"] == "high" for r in test
    )

    # the KM split uses the TRAINING patients' median risk, saved for predict
    fitted = json.loads((run / "fitted.json").read_text())
    preds = predict(
        model_dir=run, features_dir=cohort.bags, out_dir=run.parent / "pred", heatmaps=False, progress=False
    )
    risk = {r["slide"]: r["risk"] for r in preds.rows}
    assert fitted["risk_cutoff"] == pytest.approx(float(np.median([risk[s] for s in train_ids])), abs=1e-5)
    for r in test:  # predict reproduces the test risks
        assert risk[r["slide"]] == pytest.approx(float(r["risk"]), abs=1e-5)
    assert (run / "km.png").read_bytes()[:8] == PNG and (run / "report.html").is_file()
    assert list(_rows(run / "log.csv")[0]) == [
        "epoch", "train_loss", "val_loss", "val_cindex", "lr", "seconds", "peak_mem_mb",
    ]  # fmt: skip


def test_survival_cli_train_summary_and_external_validation(survival_run, tmp_path: Path) -> None:
    cohort, result = survival_run
    res = CliRunner().invoke(
        cli, ["predict", "--model", str(result.run_dir), "--features", str(cohort.bags), "--labels",
              str(cohort.labels), "--out", str(tmp_path / "ext"), "--no-progress", "--no-heatmaps"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "external validation: C-index" in res.output and "log-rank p" in res.output
    metrics = json.loads((tmp_path / "ext" / "metrics.json").read_text())
    assert metrics["split"] == "external" and metrics["n"] == len(cohort.rows) and metrics["level"] == "slide"
    assert (tmp_path / "ext" / "report.html").is_file() and (tmp_path / "ext" / "report" / "km.csv").is_file()
    # an external cohort is split at the training median risk, as the test split was
    ext = _rows(tmp_path / "ext" / "external_predictions.csv")
    cutoff = json.loads((result.run_dir / "fitted.json").read_text())["risk_cutoff"]
    assert all((float(r["risk"]) > cutoff) == (r["risk_group"] == "high") for r in ext)


def test_regression_target_is_learned(tmp_path: Path) -> None:
    cohort = make_kind_cohort(tmp_path, kind="regression", n_patients=80, seed=3)
    task = write_kind_task(tmp_path / "task.yaml", "regression", epochs=12)
    args = ["train", "--task", str(task), "--features", str(cohort.bags), "--labels", str(cohort.labels)]
    res = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "run"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "test purity: Pearson r" in res.output and "scatter.png" in res.output
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    test = _rows(tmp_path / "run" / "test_predictions.csv")
    y = np.array([float(r["purity"]) for r in test])
    p = np.array([float(r["pred_purity"]) for r in test])
    assert m["targets"]["purity"]["pearson_r"] == pytest.approx(pearson_r(y, p)) and m["pearson_r"] > 0.8
    assert np.abs(y - p).mean() < 15  # in label units (percent), not z-scores
    scaling = json.loads((tmp_path / "run" / "fitted.json").read_text())["target_scaling"]["purity"]
    assert 30 < scaling[0] < 70 and scaling[1] > 10  # mean and std of the training purities
    assert (tmp_path / "run" / "scatter.png").read_bytes()[:8] == PNG
    assert "val_pearson_r" in _rows(tmp_path / "run" / "log.csv")[0]


def test_survival_resume_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """Bags grouped into Cox risk sets, random tile subsets and a cosine schedule: an interrupted run
    resumed from its last epoch ends with the very weights of one that was never interrupted."""
    from safetensors.torch import load_file

    cohort = make_kind_cohort(tmp_path, kind="survival", n_patients=40, seed=11)
    survival = {"time": "os_months", "event": "os_event", "bags_per_step": 8}
    task = write_kind_task(
        tmp_path / "t.yaml", "survival", epochs=3, survival=survival, input_options={"bag_size": 12}
    )
    kw = {"task": task, "labels_csv": cohort.labels, "features_dir": cohort.bags, "progress": False}
    train(out_dir=tmp_path / "whole", **kw)

    class Crash(Exception):
        pass

    def crash_after_epoch_1(row: dict) -> None:
        if row["epoch"] == 1:
            raise Crash

    with pytest.raises(Crash):
        train(out_dir=tmp_path / "cut", on_epoch_end=crash_after_epoch_1, **kw)
    train(out_dir=tmp_path / "cut", resume=True, **kw)
    a, b = (
        load_file(tmp_path / "whole" / "last.safetensors"),
        load_file(tmp_path / "cut" / "last.safetensors"),
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    losses = [[r["train_loss"] for r in _rows(tmp_path / d / "log.csv")] for d in ("whole", "cut")]
    assert losses[0] == losses[1] and len(losses[0]) == 3


def test_multi_target_with_missing_labels(tmp_path: Path) -> None:
    cohort = make_kind_cohort(tmp_path, kind="multi-target", n_patients=90, seed=4, missing=0.25)
    task = write_kind_task(tmp_path / "task.yaml", "multi-target", epochs=10)
    result = train(
        task=task,
        labels_csv=cohort.labels,
        features_dir=cohort.bags,
        out_dir=tmp_path / "run",
        progress=False,
    )
    m = result.metrics
    test = _rows(tmp_path / "run" / "test_predictions.csv")
    assert any(r["tp53"] == "" for r in test) and any(r["tmb"] == "" for r in test)  # missing cells kept
    assert m["targets"]["tp53"]["n"] == sum(r["tp53"] != "" for r in test)
    assert m["targets"]["tmb"]["n"] == sum(r["tmb"] != "" for r in test)
    assert m["targets"]["tp53"]["auroc"] > 0.75 and m["targets"]["tmb"]["pearson_r"] > 0.7
    assert m["score"] == pytest.approx((m["targets"]["tp53"]["auroc"] + m["targets"]["tmb"]["pearson_r"]) / 2)
    assert all(np.isfinite(float(r["train_loss"])) for r in _rows(tmp_path / "run" / "log.csv"))
    for r in test:  # every case gets every output, labelled or not
        assert float(r["prob_tp53=wt"]) + float(r["prob_tp53=mut"]) == pytest.approx(1.0, abs=1e-5)
        assert r["predicted_tp53"] in ("wt", "mut") and r["pred_tmb"] != ""


def test_patient_level_bags_are_never_split_and_predict_per_patient(tmp_path: Path) -> None:
    cohort = make_kind_cohort(tmp_path, kind="regression", n_patients=24, seed=5, slides_per_patient=(1, 3))
    assert any(len(s) > 1 for s in cohort.slides_of.values())
    task = write_kind_task(tmp_path / "task.yaml", "regression", epochs=3, level="patient")
    result = train(
        task=task,
        labels_csv=cohort.labels,
        features_dir=cohort.bags,
        out_dir=tmp_path / "cv",
        cv=2,
        progress=False,
    )
    tested: list[str] = []
    for k in (1, 2):
        fold = tmp_path / "cv" / f"fold-{k}"
        parts: dict[str, set[str]] = {}
        for r in _rows(fold / "splits.csv"):
            parts.setdefault(r["patient"], set()).add(r["split"])
        assert all(len(p) == 1 for p in parts.values())  # no patient in two parts
        assert sorted(r["slide"] for r in _rows(fold / "splits.csv")) == sorted(
            s for slides in cohort.slides_of.values() for s in slides
        )  # every slide of every patient is in the fold
        test = _rows(fold / "test_predictions.csv")
        assert next(iter(test[0])) == "patient"
        tested += [r["patient"] for r in test]
    assert sorted(tested) == sorted(cohort.slides_of)  # each patient tested once, as one case
    assert result.metrics["pooled"]["n"] == len(cohort.slides_of)

    out = tmp_path / "ext"
    pred = predict(
        model_dir=tmp_path / "cv",
        features_dir=cohort.bags,
        out_dir=out,
        labels_csv=cohort.labels,
        progress=False,
    )
    assert sorted(r["patient"] for r in pred.rows) == sorted(cohort.slides_of)
    for r in pred.rows:
        assert r["slides"].split(";") == sorted(cohort.slides_of[r["patient"]])
    assert pred.metrics is not None and pred.metrics["n"] == len(cohort.slides_of)
    for slides in cohort.slides_of.values():  # heatmaps per slide, from the patient's one bag
        for s in slides:
            assert (out / "heatmaps" / f"{s}.png").read_bytes()[:8] == PNG


def test_slide_level_predictions_are_averaged_per_patient(tmp_path: Path) -> None:
    cohort = make_cohort(tmp_path, n_patients=10, tcga=False)
    task = tmp_path / "task.yaml"
    from cohorts import write_task

    write_task(task, epochs=2)
    train(
        task=task,
        labels_csv=cohort.labels,
        features_dir=cohort.bags,
        out_dir=tmp_path / "run",
        progress=False,
    )
    pred = predict(
        model_dir=tmp_path / "run", features_dir=cohort.bags, out_dir=tmp_path / "p",
        labels_csv=cohort.labels, heatmaps=False, progress=False,
    )  # fmt: skip
    by_slide = {r["slide"]: r["prob_LUSC"] for r in pred.rows}
    patients = _rows(tmp_path / "p" / "patient_predictions.csv")
    assert len(patients) == 10
    for r in patients:
        slides = r["slides"].split(";")
        assert slides == [s for s in sorted(cohort.slides) if cohort.patient_of[s] == r["patient"]]
        assert float(r["prob_LUSC"]) == pytest.approx(np.mean([by_slide[s] for s in slides]), abs=1e-6)
    metrics = json.loads((tmp_path / "p" / "metrics.json").read_text())
    assert metrics["n"] == len(cohort.slides) and metrics["per_patient"]["n"] == 10


def test_survival_demo_trains_on_the_demo_bags(tmp_path: Path) -> None:
    from wsi.pipelines.demo.survival import run_survival_demo

    cohort = make_cohort(tmp_path, n_patients=16, tcga=False)  # the demo's layout: slide, label, patient
    result = run_survival_demo(
        features_dir=cohort.bags, labels_csv=cohort.labels, out_dir=tmp_path / "demo", epochs=2,
        model_overrides=TINY,
    )  # fmt: skip
    labels = _rows(result.outputs["survival labels"])
    assert len(labels) == len(cohort.slides) and {r["OS_STATUS"] for r in labels} <= {"0", "1"}
    assert result.outputs["survival report"].is_file() and result.outputs["Kaplan-Meier curves"].is_file()
    assert result.c_index is None or 0.0 <= result.c_index <= 1.0
    again = run_survival_demo(features_dir=cohort.bags, labels_csv=cohort.labels, out_dir=tmp_path / "demo")
    assert again.c_index == result.c_index  # a finished study is re-used

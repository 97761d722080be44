"""Figures that cannot be estimated are reported as such, with the reason, in metrics.json, the console
line and report.html: one class, too few cases per class, too few events, one or two test cases (whose
bootstrap interval would be [1.0, 1.0]), constant or too few regression labels."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from cohorts import write_task
from kinds_cohorts import write_kind_task

from wsi.pipelines.report import write_report
from wsi.pipelines.stats import estimable
from wsi.pipelines.stats.regression import evaluate_regression
from wsi.pipelines.stats.survival import evaluate_survival
from wsi.pipelines.study.kinds import PredictionSet, build_kind
from wsi.pipelines.study.tasks import load_task


def _categorical(tmp_path: Path):
    return build_kind(load_task(write_task(tmp_path / "task.yaml", bootstrap=200)))


def _set(labels: list[int], p1: list[float]) -> PredictionSet:
    probs = np.array([[1 - p, p] for p in p1], dtype=np.float64)
    ids = [f"s{i}" for i in range(len(labels))]
    return PredictionSet("test", ids, np.array(labels, dtype=np.float64)[:, None], probs)


def test_one_class_auroc_not_estimable(tmp_path: Path) -> None:
    kind = _categorical(tmp_path)
    m = kind.evaluate(_set([1, 1, 1, 1, 1, 1], [0.9, 0.8, 0.4, 0.7, 0.6, 0.3]), n_bootstrap=200, seed=0)
    assert m["auroc"] is None and m["auroc_ci95"] == [None, None]
    assert "only one class (LUSC)" in m["not_estimable"]["auroc"]
    line = kind.summary_line(m)
    assert "AUROC not estimable (only one class (LUSC) among the 6 case(s)" in line
    assert m["accuracy"] is not None  # what can be estimated still is


def test_two_test_cases_give_no_interval_of_one(tmp_path: Path) -> None:
    """Without the rule the bootstrap interval of an AUROC of 1.0 on two cases is [1.0, 1.0]."""
    kind = _categorical(tmp_path)
    m = kind.evaluate(_set([0, 1], [0.2, 0.9]), n_bootstrap=200, seed=0)
    assert m["auroc"] == 1.0 and m["auroc_ci95"] == [None, None]
    assert (
        "too few cases per class" in m["not_estimable"]["auroc_ci95"]
        and "LUAD 1, LUSC 1" in (m["not_estimable"]["auroc_ci95"])
    )
    assert all(m[k] == [None, None] for k in m if k.endswith("_ci95"))
    assert "AUROC 1.000 (95% CI not estimable: too few cases per class" in kind.summary_line(m)


def test_too_few_per_class_for_an_interval_then_enough(tmp_path: Path) -> None:
    kind = _categorical(tmp_path)
    rng = np.random.default_rng(0)
    few = kind.evaluate(_set([0] * 3 + [1] * 20, list(rng.random(23))), n_bootstrap=200, seed=0)
    assert few["auroc"] is not None and few["auroc_ci95"] == [None, None]
    assert "LUAD 3, LUSC 20" in few["not_estimable"]["auroc_ci95"]
    labels = [0] * 15 + [1] * 15
    enough = kind.evaluate(
        _set(labels, [0.2 + 0.3 * y + 0.5 * rng.random() for y in labels]), n_bootstrap=200, seed=0
    )
    assert "not_estimable" not in enough and None not in enough["auroc_ci95"]


def test_survival_with_few_or_no_events() -> None:
    rng = np.random.default_rng(1)
    time, risk = rng.uniform(1, 60, 30), rng.normal(size=30)
    two = np.zeros(30)
    two[[3, 7]] = 1
    m = evaluate_survival(time, two, risk, high_risk=None, n_bootstrap=200)
    assert m["n_events"] == 2 and m["c_index_ci95"] == [None, None]
    assert "only 2 event(s) among 30 case(s)" in m["not_estimable"]["c_index_ci95"]
    assert all(p["auc_ci95"] == [None, None] for p in m["td_auc"])
    none = evaluate_survival(time, np.zeros(30), risk, high_risk=None, n_bootstrap=200)
    assert none["c_index"] is None and "no event" in none["not_estimable"]["c_index"]
    enough = np.zeros(30)
    enough[:12] = 1
    ok = evaluate_survival(time, enough, risk, high_risk=None, n_bootstrap=200)
    assert "c_index_ci95" not in ok.get("not_estimable", {}) and None not in ok["c_index_ci95"]


def test_survival_console_line(tmp_path: Path) -> None:
    kind = build_kind(load_task(write_kind_task(tmp_path / "t.yaml", "survival")))
    preds = PredictionSet(
        "test", ["a", "b", "c"], np.array([[5.0, 1], [9.0, 0], [12.0, 0]]), np.array([[1.0], [0.0], [0.5]])
    )
    m = kind.evaluate(preds, n_bootstrap=100, seed=0)
    assert "C-index 1.000 (95% CI not estimable: only 1 event(s) among 3 case(s)" in kind.summary_line(m)


def test_regression_constant_or_few_labels() -> None:
    m = evaluate_regression(np.array([2.0, 2.0, 2.0, 2.0]), np.array([1.0, 2.0, 3.0, 4.0]), n_bootstrap=100)
    assert m["pearson_r"] is None or np.isnan(m["pearson_r"])
    assert "all 4 labelled values are equal" in m["not_estimable"]["pearson_r"]
    assert "only 4 labelled case(s)" in m["not_estimable"]["mae_ci95"] and m["mae_ci95"] == [None, None]


def test_a_degenerate_interval_is_never_a_result() -> None:
    figures = estimable.mark({"score": 0.5, "score_ci95": [0.5, 0.5]}, {})
    assert figures["score_ci95"] == [None, None] and "same value" in figures["not_estimable"]["score_ci95"]


def test_report_and_metrics_csv_say_why(tmp_path: Path) -> None:
    kind = _categorical(tmp_path)
    preds = _set([0, 1], [0.2, 0.9])
    m = kind.evaluate(preds, n_bootstrap=100, seed=0)
    json.dumps(m)  # metrics.json holds it as is
    page = write_report(tmp_path / "rep", kind=kind, sets=[preds], metrics={"test": m}, title="t")
    html = page.read_text(encoding="utf-8")
    assert "not estimable: why" in html and "too few cases per class for a 95% interval" in html
    with (tmp_path / "rep" / "report" / "metrics.csv").open(newline="") as fh:
        rows = {r["metric"]: r for r in csv.DictReader(fh)}
    assert rows["auroc"]["ci95_low"] == "" and "too few cases per class" in rows["auroc"]["not_estimable"]

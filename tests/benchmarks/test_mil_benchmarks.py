"""benchmarks/mil_benchmarks.py end to end on a tiny generated cohort: repeated cross-validation pools
the test folds of every seed, each model sees the same folds, and the table reports the gap to ABMIL."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from mil_benchmarks import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_repeated_cross_validation_reports_every_fold_of_every_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([
        "--sets", "--synthetic", "16", "--synthetic-max-size", "6", "--models", "abmil", "seqnorm",
        "--folds", "2", "--repeats", "2", "--out", str(tmp_path),
        "--set", "epochs=2", "patience=2", "optimizer.warmup_epochs=0",
    ])  # fmt: skip
    assert code == 0
    rows = list(csv.DictReader((tmp_path / "mil_benchmarks.csv").open()))
    assert [(r["model"], r["fold"]) for r in rows] == [
        (m, str(k)) for m in ("abmil", "seqnorm") for k in (1, 2, 3, 4)
    ]  # 2 seeds x 2 folds each, per model
    assert all(0.0 <= float(r["auroc"]) <= 1.0 and 1 <= int(r["epochs_run"]) <= 2 for r in rows)
    out = capsys.readouterr().out
    assert "2-fold CV x 2 (seeds 0..1)" in out
    assert "| synthetic-16 | seqnorm |" in out and "AUROC within 0.02" in out


def test_repeats_below_one_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--sets", "--synthetic", "16", "--repeats", "0"])
    assert exc.value.code == 2 and "--repeats must be at least 1" in capsys.readouterr().err

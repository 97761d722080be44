"""benchmarks/small_cohort.py: the paired intervals on numbers worked by hand, and a tiny run of the
script through `wsi train --cv` that writes one row per (features, model, seed, fold) and the table."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from paired_stats import corrected_ci, paired_ci
from small_cohort import COLUMNS, main, summarise, table, task_yaml


def test_paired_ci_is_t_over_seed_means_not_over_folds() -> None:
    # seed means 0.1, 0.2, 0.3 (fold values differ within a seed; only their mean counts)
    diffs = np.array([[0.0, 0.2], [0.1, 0.3], [0.5, 0.1]])
    ci = paired_ci(diffs)
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t(0.975, 2) * sd(0.1, 0.2, 0.3) / sqrt(3)
    assert ci.n == 3 and ci.mean == pytest.approx(0.2)
    assert (ci.low, ci.high) == pytest.approx((0.2 - half, 0.2 + half))
    assert ci.cell() == f"+0.200 [{0.2 - half:+.3f}, {0.2 + half:+.3f}]"


def test_paired_ci_skips_missing_folds_and_refuses_nothing() -> None:
    diffs = np.array([[0.1, np.nan], [0.3, 0.3], [np.nan, np.nan]])  # seed 3 has no figure: dropped
    ci = paired_ci(diffs)
    assert ci.n == 2 and ci.mean == pytest.approx(0.2)
    one = paired_ci(np.array([[0.4, 0.2]]))
    assert one.n == 1 and one.mean == pytest.approx(0.3) and one.cell() == "+0.300 [n/a]"
    with pytest.raises(ValueError, match="no finite paired difference"):
        paired_ci(np.full((2, 3), np.nan))
    with pytest.raises(ValueError, match=r"\(seeds, folds\)"):
        paired_ci(np.zeros(4))


def test_corrected_ci_inflates_the_variance_for_overlapping_training_sets() -> None:
    diffs = np.array([[0.1, 0.3], [0.2, 0.4]])  # mean 0.25, sample variance 1/60
    ci = corrected_ci(diffs, test_over_train=1.0)  # 2-fold CV: as many test as training bags
    half = 3.182446305284263 * math.sqrt((1 / 4 + 1.0) / 60)  # t(0.975, 3)
    assert ci.n == 4 and ci.mean == pytest.approx(0.25)
    assert (ci.low, ci.high) == pytest.approx((0.25 - half, 0.25 + half))
    plain = corrected_ci(diffs, test_over_train=0.0)
    assert plain.high - plain.low < ci.high - ci.low


def test_task_yaml_names_only_the_classes_and_what_is_compared() -> None:
    assert task_yaml("seqnorm", "raw") == "classes: [negative, positive]\n"
    assert task_yaml("abmil", "std", ["bootstrap: 50"]) == (
        "classes: [negative, positive]\nmodel: {preset: abmil}\nstandardize_features: true\nbootstrap: 50\n"
    )
    with pytest.raises(ValueError, match="unknown model"):
        task_yaml("clam", "raw")


def test_summary_pairs_by_seed_and_fold_and_labels_design_data() -> None:
    def row(cohort: str, data: str, model: str, seed: int, fold: int, acc: float) -> dict[str, str]:
        values = [cohort, data, "raw", model, str(seed), str(fold), f"{acc}", f"{acc}", "10", "1.0"]
        return dict(zip(COLUMNS, values, strict=True))

    rows = [row("musk2", "unseen", "seqnorm", s, k, 0.8 + 0.05 * s) for s in (0, 1) for k in (1, 2)]
    rows += [row("musk2", "unseen", "abmil", s, k, 0.7) for s in (0, 1) for k in (1, 2)]
    rows += [row("musk1", "design", m, 0, k, 0.5) for m in ("seqnorm", "abmil") for k in (1, 2)]
    summary = summarise(rows, folds=2)
    assert [(e["cohort"], e["data"]) for e in summary] == [("musk2", "unseen"), ("musk1", "design")]
    diff = summary[0]["diff_accuracy"]
    assert diff.n == 2 and diff.mean == pytest.approx(0.125)  # type: ignore[attr-defined]
    text = table(summary)
    assert "| musk2 | raw | 2 | 0.825 | 0.700 | +0.125 [" in text
    assert "| musk1 (design data) | raw | 1 |" in text


@pytest.mark.slow  # four 2-fold `wsi train --cv` runs of 2 epochs: ~20 s idle, minutes on a busy machine
@pytest.mark.usefixtures("one_torch_thread")
def test_tiny_run_through_wsi_train_writes_every_fold_and_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([
        "--sets", "--synthetic", "16", "--synthetic-max-size", "6", "--data-seeds", "101", "--folds", "2",
        "--seeds", "2", "--epochs", "2", "--bootstrap", "5", "--features", "raw", "--out", str(tmp_path),
    ])  # fmt: skip
    assert code == 0
    rows = list(csv.DictReader((tmp_path / "small_cohort.csv").open()))
    assert [(r["seed"], r["model"], r["fold"]) for r in rows] == [
        (str(s), m, str(k)) for s in (0, 1) for m in ("seqnorm", "abmil") for k in (1, 2)
    ]
    assert all(r["cohort"] == "synthetic-16-s101" and r["data"] == "unseen" for r in rows)
    assert all(0.0 <= float(r["auroc"]) <= 1.0 and 1 <= int(r["epochs_run"]) <= 2 for r in rows)
    out = capsys.readouterr().out
    assert "`wsi train --cv 2` x 2 seeds (0..1)" in out
    assert "| cohort | features | seeds | accuracy seqnorm | accuracy ABMIL | accuracy seqnorm - ABMIL" in out
    line = next(x for x in out.splitlines() if x.startswith("| synthetic-16-s101 | raw | 2 |"))
    assert len(line.strip("|").split("|")) == 11
    # a second call with the same --out runs nothing again and prints the same table
    assert main(["--table", str(tmp_path / "small_cohort.csv")]) == 0
    assert line in capsys.readouterr().out


def test_design_seed_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--sets", "--synthetic", "16", "--data-seeds", "0"])
    assert exc.value.code == 2 and "design data" in capsys.readouterr().err

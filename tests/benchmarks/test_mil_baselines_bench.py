"""benchmarks/mil_baselines.py: the table pairs each model with ABMIL by (seed, fold), the task files name
only what is compared, a tiny run goes through `wsi train --cv`, and the cost rows have time and memory."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from mil_baselines import cost_table, main, seqnorm_table, summarise, table, task_yaml
from small_cohort import COLUMNS


def test_task_yaml_names_the_preset_and_nothing_else() -> None:
    assert task_yaml("seqnorm") == "classes: [negative, positive]\n"
    assert (
        task_yaml("dtfd", ["bootstrap: 50"])
        == "classes: [negative, positive]\nmodel: {preset: dtfd}\nbootstrap: 50\n"
    )
    with pytest.raises(ValueError, match="unknown model"):
        task_yaml("clam")


def test_the_authors_recipe_rows_name_it_and_are_paired_with_abmil_and_seqnorm() -> None:
    want = "classes: [negative, positive]\nmodel: {preset: dsmil}\nrecipe: authors\n"
    assert task_yaml("dsmil:authors") == want

    def row(model: str, fold: int, auroc: float) -> dict[str, str]:
        values = ["musk2", "unseen", "raw", model, "0", str(fold), f"{auroc}", f"{auroc}", "10", "3.0"]
        return dict(zip(COLUMNS, values, strict=True))

    rows = [row(m, k, a + 0.01 * k) for m, a in (("abmil", 0.8), ("seqnorm", 0.7), ("dtfd:authors", 0.75))
            for k in (1, 2, 3)]  # fmt: skip
    rows += [row("abmil", 1, 0.1)]  # a second copy of a fold (another CSV): the first is kept
    (entry,) = [e for e in summarise(rows, folds=3) if e["model"] == "dtfd:authors"]
    assert entry["corrected_auroc"].mean == pytest.approx(-0.05)
    assert entry["seqnorm_corrected_auroc"].mean == pytest.approx(0.05)
    assert "| musk2 | dtfd:authors | 1 | +0.050 [" in seqnorm_table(summarise(rows, folds=3))


def test_summary_pairs_every_model_with_abmil() -> None:
    def row(model: str, seed: int, fold: int, acc: float) -> dict[str, str]:
        values = ["ucsb", "unseen", "raw", model, str(seed), str(fold), f"{acc}", f"{acc}", "10", "3.0"]
        return dict(zip(COLUMNS, values, strict=True))

    rows = [row("abmil", s, k, 0.7) for s in (0, 1) for k in (1, 2)]
    rows += [row("dsmil", s, k, 0.75 + 0.1 * s) for s in (0, 1) for k in (1, 2)]
    summary = summarise(rows, folds=2)
    assert [e["model"] for e in summary] == ["abmil", "dsmil"]
    assert "diff_accuracy" not in summary[0]
    diff = summary[1]["diff_accuracy"]
    assert diff.n == 2 and diff.mean == pytest.approx(0.1)
    text = table(summary)
    assert "| ucsb | abmil | 2 | 0.700 | - | - | 0.700 |" in text
    assert "| ucsb | dsmil | 2 | 0.800 | +0.100 [" in text


def test_cost_table_has_one_column_per_mode_and_size() -> None:
    rows = [
        {"model": "abmil", "tiles": "10000", "mode": "infer", "seconds": "1.5", "peak_mb": "75", "note": ""},
        {
            "model": "abmil",
            "tiles": "100000",
            "mode": "infer",
            "seconds": "9.0",
            "peak_mb": "500",
            "note": "",
        },
        {
            "model": "abmil",
            "tiles": "10000",
            "mode": "train",
            "seconds": "",
            "peak_mb": "",
            "note": "exit code -9",
        },
    ]
    text = cost_table(rows)
    assert (
        "| model | infer 10,000 tiles: s / peak MB | infer 100,000 tiles: s / peak MB | train 10,000" in text
    )
    assert "| abmil | 1.50 / 75 | 9.00 / 500 | exit code -9 |" in text


@pytest.mark.slow  # two 2-fold `wsi train --cv` runs of 1 epoch and four measured passes
@pytest.mark.usefixtures("one_torch_thread")
def test_tiny_runs_write_rows_and_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([
        "--sets", "--synthetic", "16", "--synthetic-max-size", "6", "--folds", "2", "--seeds", "1",
        "--epochs", "1", "--bootstrap", "5", "--models", "abmil", "dtfd", "--out", str(tmp_path),
    ])  # fmt: skip
    assert code == 0
    rows = list(csv.DictReader((tmp_path / "mil_baselines.csv").open()))
    assert [(r["model"], r["fold"]) for r in rows] == [(m, str(k)) for m in ("abmil", "dtfd") for k in (1, 2)]
    assert "| synthetic-16-s101 | dtfd | 1 |" in capsys.readouterr().out
    later = ["--sets", "--synthetic", "16", "--synthetic-max-size", "6", "--folds", "2", "--seeds", "2",
             "--epochs", "1", "--bootstrap", "5", "--models", "abmil"]  # fmt: skip
    later += ["--out", str(tmp_path / "s")]
    assert main([*later, "--from-seed", "1"]) == 0  # seed 1 alone, as a parallel process runs it
    assert {r["seed"] for r in csv.DictReader((tmp_path / "s" / "mil_baselines.csv").open())} == {"1"}
    with pytest.raises(SystemExit):
        main([*later, "--from-seed", "2"])
    code = main(["--cost", str(tmp_path), "--cost-sizes", "200", "--cost-models", "clam-sb", "transmil",
                 "--cost-train-tiles", "200"])  # fmt: skip
    assert code == 0
    cost = list(csv.DictReader((tmp_path / "mil_baselines_cost.csv").open()))
    assert [(r["model"], r["mode"]) for r in cost] == [
        ("clam-sb", "infer"),
        ("transmil", "infer"),
        ("clam-sb", "train"),
        ("transmil", "train"),
    ]
    assert all(float(r["seconds"]) > 0 and r["note"] == "" for r in cost)


def test_a_run_with_no_cohort_says_so_instead_of_printing_an_empty_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--sets", "--synthetic", "--models", "transmil", "--seeds", "1"])
    assert exc.value.code == 2
    assert "no cohort to run" in capsys.readouterr().err

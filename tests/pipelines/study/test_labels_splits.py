"""Label tables (parsing, errors naming rows, matching to bags) and patient-grouped stratified splits."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from cohorts import make_bag, make_cohort, write_task

from wsi.core.errors import LabelError
from wsi.pipelines.inputs import Item
from wsi.pipelines.study.labels import default_patient, match_items, read_labels
from wsi.pipelines.study.tasks import LabelColumns
from wsi.pipelines.train import train
from wsi.pipelines.train.metrics import auroc, bootstrap_auroc, evaluate
from wsi.pipelines.train.splits import kfold_items, split_items

CLASSES = ("LUAD", "LUSC")
COLS = LabelColumns()


def _csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "labels.csv"
    path.write_text(text)
    return path


def test_patient_defaults_to_tcga_barcode_else_slide_id() -> None:
    assert default_patient("TCGA-05-4244-01Z-00-DX1.d4ff32cd-a002-4f0b-8b0c-63c5d7a1f2d2") == "TCGA-05-4244"
    assert default_patient("TCGA-05-4244-01Z-00-DX1.svs") == "TCGA-05-4244"
    assert default_patient("case_17.svs") == "case_17"


def test_labels_outside_the_task_are_named_by_row(tmp_path: Path) -> None:
    path = _csv(tmp_path, "slide,label\na,LUAD\nb,LUSC\nc,SCLC\nd,luad\n")
    with pytest.raises(LabelError) as err:
        read_labels(path, classes=CLASSES, columns=COLS)
    msg = str(err.value)
    assert "row 4 (c: 'SCLC')" in msg and "row 5 (d: 'luad')" in msg and str(path) in msg


def test_duplicate_slides_are_named_by_row(tmp_path: Path) -> None:
    path = _csv(tmp_path, "slide,label\na,LUAD\nb,LUSC\na.svs,LUSC\n")
    with pytest.raises(LabelError, match=r"a on rows 2, 4"):
        read_labels(path, classes=CLASSES, columns=COLS)


def test_missing_columns_name_what_was_found(tmp_path: Path) -> None:
    path = _csv(tmp_path, "name,diagnosis\na,LUAD\n")
    with pytest.raises(LabelError, match="found columns: name, diagnosis") as err:
        read_labels(path, classes=CLASSES, columns=COLS)
    assert "name yours under `columns:` in a task YAML" in str(err.value)  # and how to fix it


def test_aliases_and_semicolons(tmp_path: Path) -> None:
    path = _csv(tmp_path, "FILENAME;PATIENT;label\nx1.svs;P1;LUAD\nx2.svs;P1;LUAD\n")
    rows = read_labels(path, classes=CLASSES, columns=COLS)
    assert [(r.slide, r.patient) for r in rows] == [("x1.svs", "P1"), ("x2.svs", "P1")]


def test_class_with_fewer_than_two_patients(tmp_path: Path) -> None:
    path = _csv(tmp_path, "slide,label,patient\na,LUAD,p1\nb,LUAD,p2\nc,LUSC,p3\nd,LUSC,p3\n")
    rows = read_labels(path, classes=CLASSES, columns=COLS)
    found = {s: tmp_path / f"{s}.h5" for s in "abcd"}
    with pytest.raises(LabelError, match=r"fewer than two patients.*LUSC \(1\)"):
        match_items(rows, found, classes=CLASSES, labels_path=path)


def test_missing_bags_and_unlabelled_bags_are_counted_and_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.set_num_threads(1)
    cohort = make_cohort(tmp_path, n_patients=12)
    (cohort.bags / f"{cohort.slides[0]}.h5").unlink()  # a labelled slide without a bag
    make_bag(cohort.bags / "stray-slide.h5", label=0, rng=np.random.default_rng(1), n=5)  # no label
    with cohort.labels.open("a") as fh:
        fh.write("never-embedded.svs,LUSC\n")
    task = write_task(tmp_path / "task.yaml", epochs=1)
    with caplog.at_level(logging.WARNING):
        result = train(
            task=task,
            labels_csv=cohort.labels,
            features_dir=cohort.bags,
            out_dir=tmp_path / "run",
            progress=False,
        )
    assert "2 labelled slide(s) have no input file" in caplog.text
    assert "1 input file(s) have no label row" in caplog.text
    counts = json.loads(result.config_path.read_text())["counts"]
    assert counts == {
        "slides": len(cohort.slides) - 1,
        "patients": 12,
        "labelled_without_input": 2,
        "inputs_without_label": 1,
    }


def _items(n_patients: int, seed: int = 0) -> list[Item]:
    rng = np.random.default_rng(seed)
    items = []
    for p in range(n_patients):
        label = int(rng.random() < 0.4)
        for s in range(int(rng.integers(1, 4))):
            items.append(Item(id=f"p{p}-s{s}", path=Path(f"p{p}-s{s}.h5"), label=label, patient=f"p{p}"))
    return items


def test_split_keeps_patients_together_and_stratifies() -> None:
    items = _items(300)
    split = split_items(items, train=0.6, val=0.14, test=0.26, seed=3)
    groups = [{it.group for it in part} for part in (split.train, split.val, split.test)]
    assert not (groups[0] & groups[1]) and not (groups[0] & groups[2]) and not (groups[1] & groups[2])
    assert sum(map(len, groups)) == 300
    assert [round(len(g) / 300, 2) for g in groups] == [0.6, 0.14, 0.26]
    for part in (split.train, split.val, split.test):  # class balance of patients follows the whole set
        frac = np.mean([it.label for it in {it.group: it for it in part}.values()])
        assert abs(frac - np.mean([it.label for it in {it.group: it for it in items}.values()])) < 0.03
    again = split_items(items, train=0.6, val=0.14, test=0.26, seed=3)
    assert [it.id for it in again.test] == [it.id for it in split.test]
    other = split_items(items, train=0.6, val=0.14, test=0.26, seed=4)
    assert [it.id for it in other.test] != [it.id for it in split.test]


def test_small_cohort_still_gives_every_split_both_classes() -> None:
    # three patients per class: one each for train, validation and test
    items = [Item(id=f"s{p}", path=Path(f"s{p}.h5"), label=p % 2, patient=f"p{p}") for p in range(6)]
    split = split_items(items, train=0.6, val=0.14, test=0.26, seed=0)
    for part in (split.train, split.val, split.test):
        assert sorted(it.label for it in part) == [0, 1]
    # two per class: train and validation (early stopping needs both classes there), no test
    split = split_items(items[:4], train=0.6, val=0.14, test=0.26, seed=0)
    assert sorted(it.label for it in split.val) == [0, 1] and not split.test


def test_kfold_test_sets_partition_the_patients() -> None:
    items = _items(60)
    folds = kfold_items(items, k=5, val_fraction=0.2, seed=1)
    tested = [it.id for f in folds for it in f.test]
    assert sorted(tested) == sorted(it.id for it in items)
    for f in folds:
        g = [{it.group for it in part} for part in (f.train, f.val, f.test)]
        assert not (g[0] & g[1]) and not (g[0] & g[2]) and not (g[1] & g[2])
        assert {it.label for it in f.val} == {0, 1}
    with pytest.raises(LabelError, match="use fewer folds"):
        kfold_items(_items(6), k=5, val_fraction=0.2, seed=1)


def test_metrics_match_sklearn_and_bootstrap_brackets_the_estimate() -> None:
    from sklearn.metrics import balanced_accuracy_score, roc_auc_score

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 120)
    score = np.clip(labels * 0.3 + rng.random(120) * 0.7, 0, 1).round(2)  # with ties
    probs = np.stack([1 - score, score], axis=1)
    assert auroc(labels, probs) == pytest.approx(roc_auc_score(labels, score))
    lo, hi = bootstrap_auroc(labels, probs, n_resamples=500, seed=0)
    assert lo < auroc(labels, probs) < hi and hi - lo < 0.3
    fig = evaluate(labels, probs, CLASSES, n_bootstrap=100)
    assert fig["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, probs.argmax(1)))
    assert np.array(fig["confusion_matrix"]).sum() == 120
    three = rng.dirichlet([1, 1, 1], 90)
    y3 = rng.integers(0, 3, 90)
    assert auroc(y3, three) == pytest.approx(roc_auc_score(y3, three, multi_class="ovr", average="macro"))
    assert np.isnan(auroc(np.zeros(5, int), probs[:5]))


def test_a_table_matching_no_input_says_so_with_both_sides_ids(tmp_path: Path) -> None:
    """Not `class(es) with fewer than two patients: LUAD (0), LUSC (0)`: the ids never met."""
    found = {s: tmp_path / f"{s}.h5" for s in ("cmu-1", "cmu-2", "tcga-1", "tcga-2")}
    other = _csv(tmp_path, "slide,label\nslide-a,LUAD\nslide-b,LUAD\nslide-c,LUSC\nslide-d,LUSC\n")
    with pytest.raises(LabelError) as err:
        match_items(read_labels(other, classes=CLASSES, columns=COLS), found, classes=CLASSES,
                    labels_path=other)  # fmt: skip
    msg = str(err.value)
    assert msg.startswith(f"{other}: none of its 4 row(s) matches one of the 4 input file(s)")
    assert "rows name e.g. slide-a, slide-b, slide-c" in msg and "inputs are e.g. cmu-1, cmu-2, tcga-1" in msg
    assert "slide column must hold the input files' names" in msg
    upper = _csv(tmp_path, "slide,label\nCMU-1.svs,LUAD\nCMU-2,LUAD\nTCGA-1,LUSC\nTCGA-2,LUSC\n")
    for check in (True, False):  # training, and external validation (which scores what it gets)
        with pytest.raises(LabelError, match=r"differ only by letter case \(e\.g\. 'CMU-1\.svs'\)"):
            match_items(read_labels(upper, classes=CLASSES, columns=COLS), found, classes=CLASSES,
                        labels_path=upper, check=check)  # fmt: skip

"""Task kinds without training: task YAML rules, label tables per kind, patient cases, the packaged
tasks, and the outputs a kind derives from logits."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from kinds_cohorts import IN_DIM, texture_bag, write_kind_task

from wsi.core.errors import ConfigError, LabelError
from wsi.pipelines.inputs import Item, build_input
from wsi.pipelines.study.cases import SLIDE_GAP_UM, CaseDataset, group_by_patient
from wsi.pipelines.study.kinds import build_kind
from wsi.pipelines.study.labels import match_items, read_label_table
from wsi.pipelines.study.tasks import load_task


def _csv(tmp_path: Path, text: str, name: str = "labels.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kind": "survival", "classes": ["a", "b"]}, "`classes` is for categorical"),
        ({"kind": "regression"}, "needs `targets`"),
        (
            {
                "kind": "regression",
                "targets": [{"column": "x", "type": "categorical", "classes": ["a", "b"]}],
            },
            "must be continuous",
        ),
        (
            {"kind": "multi-target", "targets": [{"column": "m", "type": "categorical", "classes": ["a"]}]},
            "two or more distinct classes",
        ),
        ({"kind": "multi-target", "targets": [{"column": "m"}, {"column": "m"}]}, "name a column twice"),
        ({"kind": "regression", "targets": [{"column": "m", "weight": 0}]}, "loss weight 0"),
        (
            {"kind": "survival", "survival": {"bags_per_step": 1}},
            r"survival\.bags_per_step.*greater than or equal to 2",
        ),
        ({"kind": "survival", "survival": {"ties": "exact"}}, r"survival\.ties"),
        ({"kind": "categorical", "survival": {"time": "t"}}, "`survival` options are for survival"),
        ({"kind": "survival", "class_weighting": "balanced"}, "class_weighting is for categorical"),
        ({"kind": "categorical", "level": "patient", "input": "images"}, "needs input: bags"),
        ({"kind": "cox"}, "kind"),
    ],
)
def test_task_yaml_rules_per_kind(tmp_path: Path, changes: dict, message: str) -> None:
    import yaml

    base = {"classes": ["LUAD", "LUSC"]} if changes.get("kind") == "categorical" else {}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "input": "bags", **base, **changes}))
    with pytest.raises(ConfigError, match=message):
        load_task(path)


def test_packaged_tasks_of_every_kind() -> None:
    os_task = load_task("nsclc-os")
    assert os_task.kind == "survival" and os_task.level == "patient"
    surv = build_kind(os_task)
    assert surv.num_outputs == 1 and surv.target_names == ("OS_MONTHS", "OS_STATUS") and surv.group_bags == 32
    purity = build_kind(load_task("tumor-purity"))
    assert purity.num_outputs == 1 and purity.task.regression_options.loss == "huber"
    panel = build_kind(load_task("nsclc-mutations"))
    assert panel.num_outputs == 4 * 2 + 1 and panel.output_columns[-1] == "pred_TMB"
    assert build_kind(load_task("nsclc-subtype")).output_columns == ("prob_LUAD", "prob_LUSC")


def test_survival_labels_read_every_common_spelling(tmp_path: Path) -> None:
    task = load_task("nsclc-os").replace(level="slide")
    kind = build_kind(task)
    path = _csv(tmp_path, "slide,patient,OS_MONTHS,OS_STATUS\n"
                "a,p1,12.5,1:DECEASED\nb,p2,30,0:LIVING\nc,p3,4,dead\nd,p4,,\ne,p5,7,True\n")  # fmt: skip
    rows = read_label_table(path, task=task, kind=kind)
    assert [(r.slide, r.target) for r in rows] == [
        ("a", (12.5, 1.0)),
        ("b", (30.0, 0.0)),
        ("c", (4.0, 1.0)),
        ("e", (7.0, 1.0)),
    ]  # fmt: skip  (d has no label: left out)
    bad = _csv(tmp_path, "slide,OS_MONTHS,OS_STATUS\na,soon,1\nb,-3,0\nc,5,maybe\n", "bad.csv")
    with pytest.raises(LabelError) as err:
        read_label_table(bad, task=task, kind=kind)
    msg = str(err.value)
    assert "row 2 (a: OS_MONTHS 'soon' is not a number)" in msg and "row 3" in msg and "row 4" in msg
    with pytest.raises(LabelError, match="OS_MONTHS, OS_STATUS; found columns: slide, label"):
        read_label_table(_csv(tmp_path, "slide,label\na,x\n", "c.csv"), task=task, kind=kind)


def test_multi_target_labels_keep_blank_cells_as_missing(tmp_path: Path) -> None:
    task = load_task(write_kind_task(tmp_path / "t.yaml", "multi-target"))
    kind = build_kind(task)
    path = _csv(tmp_path, "slide,tp53,tmb\na,mut,3.5\nb,,2\nc,wt,\nd,,\n")
    rows = read_label_table(path, task=task, kind=kind)
    assert [r.slide for r in rows] == ["a", "b", "c"]  # d: every target blank
    assert rows[1].target[0] != rows[1].target[0] and rows[1].target[1] == 2.0  # NaN, 2
    with pytest.raises(LabelError, match=r"tp53 'MUT' is not one of \['wt', 'mut'\]"):
        read_label_table(_csv(tmp_path, "slide,tp53,tmb\na,MUT,1\n", "b.csv"), task=task, kind=kind)
    logits = torch.tensor([[2.0, 0.0, 0.5]])
    out = kind.outputs(logits)[0]
    assert out[:2].sum() == pytest.approx(1.0) and out[2] == pytest.approx(0.5)  # no scaling fitted yet


def test_a_patient_table_matches_every_slide_of_the_patient(tmp_path: Path) -> None:
    task = load_task("nsclc-os")
    kind = build_kind(task)
    path = _csv(
        tmp_path, "patient,OS_MONTHS,OS_STATUS\nTCGA-05-4244,10,1\nTCGA-05-4245,20,0\nTCGA-05-9999,5,1\n"
    )
    rows = read_label_table(path, task=task, kind=kind)
    found = {s: tmp_path / f"{s}.h5" for s in (
        "TCGA-05-4244-01Z-00-DX1", "TCGA-05-4244-01Z-00-DX2", "TCGA-05-4245-01Z-00-DX1", "TCGA-05-42450-01Z",
    )}  # fmt: skip
    matched = match_items(rows, found, labels_path=path, kind=kind, check=False)
    by_patient = {it.id: it.group for it in matched.items}
    assert by_patient == {
        "TCGA-05-4244-01Z-00-DX1": "TCGA-05-4244",
        "TCGA-05-4244-01Z-00-DX2": "TCGA-05-4244",
        "TCGA-05-4245-01Z-00-DX1": "TCGA-05-4245",
    }  # fmt: skip  (TCGA-05-42450 is another patient, not a slide of TCGA-05-4245)
    assert matched.unlabelled == ["TCGA-05-42450-01Z"] and matched.missing_inputs == ["patient TCGA-05-9999"]
    cases = group_by_patient(matched.items)
    assert [(c.id, [s for s, _ in c.slides]) for c in cases] == [
        ("TCGA-05-4244", ["TCGA-05-4244-01Z-00-DX1", "TCGA-05-4244-01Z-00-DX2"]),
        ("TCGA-05-4245", ["TCGA-05-4245-01Z-00-DX1"]),
    ]
    with pytest.raises(LabelError, match="2 patient\\(s\\) with an input; a split needs at least 3"):
        match_items(rows, found, labels_path=path, kind=kind)  # training refuses what scoring accepts


def test_slides_of_a_patient_must_agree(tmp_path: Path) -> None:
    items = [
        Item(id="s1", path=tmp_path / "s1.h5", patient="p", target=(10.0, 1.0)),
        Item(id="s2", path=tmp_path / "s2.h5", patient="p", target=(12.0, 1.0)),
    ]
    with pytest.raises(LabelError, match="patient p's slides have different labels"):
        group_by_patient(items, "labels.csv")


def test_a_patient_bag_keeps_every_tile_and_no_two_slides_share_a_position(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    slides = []
    for s in range(3):
        path = tmp_path / f"p-S{s}.h5"
        texture_bag(path, fraction=0.5, n=12 + s, rng=rng)
        slides.append((path.stem, path))
    case = Item(id="p", path=slides[0][1], patient="p", target=(1.0, 0.0), slides=tuple(slides))
    sample = CaseDataset(build_input("bags"), [case], train=False, n_targets=2)[0]
    assert sample["x"].shape == (12 + 13 + 14, IN_DIM) and sample["id"] == "p"
    assert torch.equal(sample["target"], torch.tensor([1.0, 0.0]))
    coords = sample["coords_um"].numpy()
    assert len({tuple(c) for c in coords}) == len(coords)  # no collision
    spans = []
    for part in sample["parts"]:
        xs = coords[part["start"] : part["stop"], 0]
        spans.append((xs.min(), xs.max() + 256.0))
        # positions kept per slide: the joined coordinates are the slide's own, shifted along x only
        from wsi.formats.bags import read_bag

        own = read_bag(part["path"]).coords_um
        np.testing.assert_allclose(coords[part["start"] : part["stop"]] - [part["shift_um"], 0], own)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start - end >= SLIDE_GAP_UM - 256.0  # tile squares of two slides never overlap


def test_categorical_kind_is_the_old_loss_and_probabilities() -> None:
    task = load_task("nsclc-subtype")
    kind = build_kind(task)
    logits = torch.tensor([[0.3, -1.2], [2.0, 0.1]])
    labels = torch.tensor([1, 0])
    assert torch.equal(
        kind.loss(logits, labels[:, None].float(), labels), torch.nn.functional.cross_entropy(logits, labels)
    )
    assert torch.equal(kind.outputs(logits), torch.softmax(logits, dim=-1))
    assert math.isnan(kind.validation(np.zeros((0, 1)), np.zeros((0, 2)), np.zeros((0, 2)))[0])


def test_a_validation_c_index_of_a_few_pairs_is_not_estimable(caplog: pytest.LogCaptureFixture) -> None:
    """The survival demo's two validation patients hold one comparable pair: their C-index is 0 or 1
    at every epoch (it read 0.000 for all 15). Below MIN_VAL_PAIRS pairs the validation C-index is NaN
    (the epoch is chosen by the Cox loss), said once in words; with enough pairs it is the C-index."""
    import logging

    from wsi.pipelines.stats.estimable import MIN_VAL_PAIRS
    from wsi.pipelines.stats.survival import comparable_pairs, concordance_index

    kind = build_kind(load_task("nsclc-os"))
    two = np.array([[23.32, 0.0], [1.54, 1.0]])  # the demo's validation split: one pair
    wrong = np.array([[0.4], [0.1]])  # the event has the lower risk: C = 0
    assert comparable_pairs(two[:, 0], two[:, 1]) == 1 and concordance_index(*two.T, wrong[:, 0]) == 0.0
    with caplog.at_level(logging.WARNING):
        for _ in range(3):  # three epochs
            loss, figures, score = kind.validation(two, wrong, wrong)
    assert math.isnan(figures["val_cindex"]) and math.isfinite(loss) and score[1] == -loss
    said = [r.getMessage() for r in caplog.records if "validation C-index not estimable" in r.getMessage()]
    assert len(said) == 1 and "2 case(s) hold 1 comparable pair(s)" in said[0], said
    assert "chosen by the validation Cox loss" in said[0]

    rng = np.random.default_rng(0)
    time, event = rng.uniform(1, 60, 12), np.array([1, 0] * 6, dtype=float)
    assert comparable_pairs(time, event) >= MIN_VAL_PAIRS
    risk = -time[:, None]  # earlier time, higher risk: C = 1
    _, figures, _ = kind.validation(np.stack([time, event], 1), risk, risk)
    assert figures["val_cindex"] == pytest.approx(1.0)

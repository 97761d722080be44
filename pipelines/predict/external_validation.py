"""The cohort `wsi predict` works on, and its external validation (`--labels cohort.csv`).

`build_cohort` turns the inputs found into the cases the run predicts: slides, or at `level: patient`
every slide of a patient as one case, the patients taken from the label table when one is given (else
from the slide ids: TCGA barcodes' first 12 characters, or the id itself). With a label table the
cases carry their targets, and `evaluate_cohort` computes the task's full figures with 95% bootstrap
intervals on them and writes the same report as training: metrics.json, external_predictions.csv,
report.html and report/. A slide-level run's predictions are also averaged per patient (mean of the
probabilities, values or risks of a patient's slides), written to patient_predictions.csv and, with
labels, scored as a second set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.errors import LabelError
from wsi.core.files import write_csv_atomic, write_json_atomic
from wsi.pipelines.inputs import Item
from wsi.pipelines.study.cases import group_by_patient
from wsi.pipelines.study.kinds import PredictionSet, TaskKind
from wsi.pipelines.study.labels import default_patient, match_items, read_label_table
from wsi.pipelines.study.tasks import TaskConfig

log = logging.getLogger(__name__)


@dataclass
class Cohort:
    """The cases to predict, and for each slide its patient."""

    cases: list[Item]
    patient_of: dict[str, str]  # slide id -> patient
    labelled: bool  # a label table was given
    missing: list[str] = field(default_factory=list)  # labelled slides / patients with no input
    mpp_by_slide: dict[str, float] = field(default_factory=dict)  # the label table's `mpp` column


def build_cohort(
    found: Mapping[str, Path], *, task: TaskConfig, kind: TaskKind, labels_csv: str | Path | None
) -> Cohort:
    """The cases of the inputs found: slides, or patients at `level: patient` (see the module doc)."""
    target_of: dict[str, tuple[float, ...]] = {}
    patient_of = {sid: default_patient(sid) for sid in found}
    missing: list[str] = []
    mpp_by_slide: dict[str, float] = {}
    if labels_csv is not None:
        rows = read_label_table(labels_csv, task=task, kind=kind)
        matched = match_items(
            rows, found, classes=task.classes, labels_path=labels_csv, kind=kind, check=False
        )
        missing, mpp_by_slide = matched.missing_inputs, matched.mpp_by_slide
        for it in matched.items:
            target_of[it.id] = it.target
            patient_of[it.id] = it.group
    slides = [
        Item(id=sid, path=path, patient=patient_of[sid], target=target_of.get(sid, ()))
        for sid, path in sorted(found.items())
    ]
    if task.level != "patient":
        return Cohort(slides, patient_of, labels_csv is not None, missing, mpp_by_slide)
    # a patient's label from any of its labelled slides (the table may list only some of them)
    label_of = {it.group: it.target for it in slides if it.target}
    slides = [replace(it, target=label_of.get(it.group, ())) for it in slides]
    cases = group_by_patient(slides, str(labels_csv or "inputs"))
    return Cohort(cases, patient_of, labels_csv is not None, missing, mpp_by_slide)


def aggregate_by_patient(
    ids: Sequence[str], outputs: np.ndarray, patient_of: Mapping[str, str]
) -> tuple[list[str], list[list[str]], np.ndarray]:
    """(patients, their slides, (P, K) mean outputs) in the order patients first appear."""
    slides_of: dict[str, list[int]] = {}
    for i, sid in enumerate(ids):
        slides_of.setdefault(patient_of.get(sid, sid), []).append(i)
    patients = list(slides_of)
    means = np.stack([outputs[slides_of[p]].mean(0) for p in patients]) if patients else outputs[:0]
    return patients, [[ids[i] for i in slides_of[p]] for p in patients], means


def write_patient_predictions(
    path: Path, kind: TaskKind, patients: Sequence[str], slides: Sequence[Sequence[str]], means: np.ndarray
) -> None:
    header = ["patient", "slides", *kind.output_columns, *kind.derived_columns()]
    rows = (
        [p, ";".join(s), *[f"{v:.6f}" for v in m], *kind.derived_cells(m)]
        for p, s, m in zip(patients, slides, means, strict=True)
    )
    write_csv_atomic(path, header, rows)


def _labelled_set(
    name: str, ids: Sequence[str], outputs: np.ndarray, target_of: Mapping[str, Any]
) -> PredictionSet:
    keep = [i for i, cid in enumerate(ids) if target_of.get(cid)]
    targets = np.array([target_of[ids[i]] for i in keep], dtype=np.float64)
    return PredictionSet(name, [ids[i] for i in keep], targets.reshape(len(keep), -1), outputs[keep])


def evaluate_cohort(
    *,
    task: TaskConfig,
    kind: TaskKind,
    cohort: Cohort,
    ids: Sequence[str],
    outputs: np.ndarray,
    out_dir: Path,
) -> dict[str, Any]:
    """The task's figures on the labelled cases predicted: metrics.json, external_predictions.csv,
    report.html + report/ in `out_dir`; a slide-level cohort is also scored per patient."""
    # imported here: scikit-learn and scipy cost ~110 MB of memory, which predicting without labels
    # (a million-tile bag on a 3 GB budget) never needs
    from wsi.pipelines.report import write_report
    from wsi.pipelines.stats.classification import json_safe

    target_of = {c.id: c.target for c in cohort.cases}
    cases = _labelled_set("external", ids, outputs, target_of)
    if not len(cases):
        raise LabelError("no predicted case has a label; check that the label table names these slides")
    id_column = "patient" if task.level == "patient" else "slide"
    kind.write_predictions(out_dir / "external_predictions.csv", cases, id_column=id_column)
    figures = kind.evaluate(cases, n_bootstrap=task.bootstrap, seed=task.seed)
    result: dict[str, Any] = {
        "split": "external", "kind": kind.name, "level": task.level, "n_predicted": len(ids), **figures,
        "labelled_without_prediction": len(cohort.missing),
    }  # fmt: skip
    sets, by_set = [cases], {"external": json_safe(figures)}
    if task.level == "slide":
        patients, _, means = aggregate_by_patient(ids, outputs, cohort.patient_of)
        if len(patients) < len(ids):  # some patient has several slides: their mean is another study
            label_of: dict[str, Any] = {}
            for sid in ids:
                label_of.setdefault(cohort.patient_of.get(sid, sid), target_of.get(sid) or None)
            per_patient = _labelled_set(
                "per patient", patients, means, {p: t for p, t in label_of.items() if t}
            )
            if len(per_patient):
                result["per_patient"] = kind.evaluate(per_patient, n_bootstrap=task.bootstrap, seed=task.seed)
                sets.append(per_patient)
                by_set["per patient"] = json_safe(result["per_patient"])
    result = json_safe(result)
    write_json_atomic(out_dir / "metrics.json", result)
    write_report(out_dir, kind=kind, sets=sets, metrics=by_set, title=f"{task.name}: external validation",
                 seed=task.seed)  # fmt: skip
    log.info("external validation on %d labelled %ss: %s", len(cases), task.level, kind.summary_line(result))
    return dict(result)


__all__ = [
    "Cohort",
    "aggregate_by_patient",
    "build_cohort",
    "evaluate_cohort",
    "write_patient_predictions",
]

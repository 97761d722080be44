"""Patient-grouped, class-stratified splits and K folds with a fixed seed.

All slides of a patient land in one split (otherwise a model is tested on a patient it has seen).
Stratification works on patients: each patient takes the most common label of their slides.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.model_selection import StratifiedGroupKFold

from wsi.core.errors import LabelError
from wsi.pipelines.inputs import Item


@dataclass(frozen=True)
class Split:
    train: list[Item]
    val: list[Item]
    test: list[Item]

    def rows(self) -> list[tuple[str, str, int, str]]:
        """(id, patient, label, split) rows for splits.csv."""
        return [
            (it.id, it.group, it.label, name)
            for name, items in (("train", self.train), ("val", self.val), ("test", self.test))
            for it in items
        ]


def _patient_labels(items: Sequence[Item]) -> dict[str, int]:
    per_patient: dict[str, Counter[int]] = defaultdict(Counter)
    for it in items:
        per_patient[it.group][it.label] += 1
    # most common label; ties to the lower class index so the result never depends on order
    return {p: min(c, key=lambda lab: (-c[lab], lab)) for p, c in sorted(per_patient.items())}


def _counts(n: int, fractions: Sequence[float]) -> list[int]:
    """Split n patients by fractions (largest remainder). Non-zero parts get at least one patient,
    in order of priority (train, then validation, then test) while patients last."""
    raw = [n * f for f in fractions]
    counts = [int(np.floor(r)) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)[: n - sum(counts)]:
        counts[i] += 1
    for i, f in enumerate(fractions):
        if f > 0 and counts[i] == 0:
            donors = [j for j in range(len(counts)) if counts[j] > 1 or (j > i and counts[j] == 1)]
            if donors:
                donor = max(donors, key=lambda j: (counts[j], j))
                counts[donor] -= 1
                counts[i] = 1
    return counts


def split_items(items: Sequence[Item], *, train: float, val: float, test: float, seed: int) -> Split:
    """One train/val/test split of patients, stratified by class, reproducible from `seed`."""
    patient_label = _patient_labels(items)
    by_class: dict[int, list[str]] = defaultdict(list)
    for patient, label in patient_label.items():
        by_class[label].append(patient)
    rng = random.Random(seed)
    assign: dict[str, str] = {}
    for label in sorted(by_class):
        patients = sorted(by_class[label])
        rng.shuffle(patients)
        n_train, n_val, _n_test = _counts(len(patients), (train, val, test))
        for i, p in enumerate(patients):
            assign[p] = "train" if i < n_train else ("val" if i < n_train + n_val else "test")
    parts: dict[str, list[Item]] = {"train": [], "val": [], "test": []}
    for it in items:
        parts[assign[it.group]].append(it)
    return Split(**parts)


def kfold_items(items: Sequence[Item], *, k: int, val_fraction: float, seed: int) -> list[Split]:
    """K patient-grouped stratified folds; each fold's test part is one of K disjoint patient sets and
    its remaining patients are split again into train and validation (for early stopping)."""
    if k < 2:
        raise LabelError(f"--cv needs K >= 2 folds, got {k}")
    patient_label = _patient_labels(items)
    per_class = Counter(patient_label.values())
    if min(per_class.values()) < k:
        raise LabelError(
            f"{k}-fold cross-validation needs at least {k} patients per class; have "
            + ", ".join(f"class {c}: {n}" for c, n in sorted(per_class.items()))
            + "; use fewer folds"
        )
    ids = np.arange(len(items))
    labels = np.array([it.label for it in items])
    groups = np.array([it.group for it in items])
    folds: list[Split] = []
    splitter = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    for fold, (rest_idx, test_idx) in enumerate(splitter.split(ids, labels, groups)):
        rest = [items[i] for i in rest_idx]
        inner = split_items(rest, train=1 - val_fraction, val=val_fraction, test=0.0, seed=seed + fold)
        folds.append(Split(train=inner.train, val=inner.val, test=[items[i] for i in test_idx]))
    return folds

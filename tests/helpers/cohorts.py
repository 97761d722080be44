"""A separable synthetic cohort of feature bags (written with wsi.formats.bags) for the training,
predict and input tests; tests/pipelines/train/test_train_synthetic.py checks it is what they assume."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wsi.formats.bags import BagProvenance, write_bag

IN_DIM = 16


TINY = {"dim": 32, "attn_dim": 32, "depth": 1, "heads": 4, "mlp_dim": 32}


CLASSES = ("LUAD", "LUSC")


@dataclass
class Cohort:
    bags: Path
    labels: Path
    slides: list[str]
    labels_of: dict[str, str]
    patient_of: dict[str, str]


def make_bag(
    path: Path,
    *,
    label: int,
    rng: np.random.Generator,
    n: int,
    encoder: str = "test-encoder",
    sha: str = "0" * 64,
) -> None:
    """Class 1 shifts features 0-3 up and class 0 down, on every tile plus strongly on a few."""
    feats = rng.normal(size=(n, IN_DIM)).astype(np.float32)  # (N, D)
    sign = 1.0 if label else -1.0
    feats[:, :4] += 0.8 * sign
    feats[: max(1, n // 5), :4] += 2.0 * sign
    grid = rng.permutation(64)[:n]
    coords_um = np.stack([grid % 8, grid // 8], axis=1).astype(np.float32) * 256.0  # (N, 2)
    provenance = BagProvenance(
        slide_id=path.stem,
        encoder=encoder,
        weights_sha256=sha,
        tile_um=256.0,
        tile_px=256,
        mpp=0.5,
        level0_width=4096,
        level0_height=4096,
        tile_params={"tile_um": 256.0, "tile_px": 256},
    )
    write_bag(
        path,
        feats=feats,
        coords_um=coords_um,
        coords_px=(coords_um / 0.5).astype(np.int64),
        provenance=provenance,
    )


def make_cohort(root: Path, *, n_patients: int = 24, seed: int = 0, tcga: bool = True) -> Cohort:
    """`n_patients` patients, half per class; every third patient has two slides. Patient ids are
    left out of the CSV (TCGA barcodes carry them) unless `tcga` is False."""
    rng = np.random.default_rng(seed)
    bags = root / "bags"
    bags.mkdir(parents=True, exist_ok=True)
    slides, labels_of, patient_of = [], {}, {}
    for p in range(n_patients):
        label = p % 2
        patient = f"TCGA-AB-{p:04d}" if tcga else f"P{p:03d}"
        for s in range(2 if p % 3 == 0 else 1):
            slide = f"{patient}-01Z-00-DX{s + 1}" if tcga else f"{patient}-slide{s + 1}"
            make_bag(bags / f"{slide}.h5", label=label, rng=rng, n=int(rng.integers(6, 28)))
            slides.append(slide)
            labels_of[slide] = CLASSES[label]
            patient_of[slide] = patient
    labels = root / "labels.csv"
    with labels.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["slide", "label"] if tcga else ["slide", "label", "patient"])
        for slide in slides:
            # file names work as well as ids in the slide column
            name = f"{slide}.svs" if len(slide) % 2 else slide
            writer.writerow([name, labels_of[slide]] + ([] if tcga else [patient_of[slide]]))
    return Cohort(bags, labels, slides, labels_of, patient_of)


def write_task(path: Path, **changes: object) -> Path:
    """A user-defined task YAML with a tiny model; `changes` replace top-level keys."""
    import yaml

    task: dict[str, object] = {
        "name": "toy-subtype",
        "classes": list(CLASSES),
        "input": "bags",
        "recipe": "paper",  # the recipe these tests were written for (issue 14 made small-cohort the default)
        "model": {"preset": "vit-wsi", "attention": "seqnorm", "overrides": dict(TINY)},
        "optimizer": {"lr": 2.0e-3, "weight_decay": 1.0e-2, "schedule": "cosine"},
        "epochs": 12,
        "patience": 6,
        "seed": 7,
        "bootstrap": 200,
    }
    task.update(changes)
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    return path

"""Generated cohorts whose truth is known by construction, for the task-kind tests.

Every slide is a bag of tiles of two textures, A and B (features written with `wsi.formats.bags.write_bag`,
positions on a grid): a B tile has features 0-3 raised, an A tile lowered, plus noise. The fraction of
B tiles in a slide (or over all of a patient's slides) is what every label is a function of:

  survival     times from a Cox model with hazard h0 * exp(BETA * fraction), uniform censoring
  regression   purity = 100 * fraction (+ small noise)
  multi-target mutation = mut when fraction > 0.5, tmb = 10 * fraction; some cells left blank
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from wsi.formats.bags import BagProvenance, write_bag

IN_DIM = 16
TINY = {"dim": 32, "attn_dim": 32, "depth": 1, "heads": 4, "mlp_dim": 32}
BETA = 4.0  # log hazard ratio of an all-B slide against an all-A one


@dataclass
class KindCohort:
    bags: Path
    labels: Path
    fraction: dict[str, float]  # patient -> true fraction of texture B over all its tiles
    slides_of: dict[str, list[str]]  # patient -> slide ids
    rows: list[dict[str, str]]  # the label table's rows


def texture_bag(
    path: Path, *, fraction: float, n: int, rng: np.random.Generator, slide_path: str = ""
) -> int:
    """A bag of n tiles, round(fraction * n) of texture B; returns the number of B tiles."""
    n_b = round(fraction * n)
    is_b = np.zeros(n, dtype=bool)
    is_b[rng.permutation(n)[:n_b]] = True
    feats = rng.normal(size=(n, IN_DIM)).astype(np.float32)  # (N, D)
    feats[:, :4] += np.where(is_b, 1.5, -1.5)[:, None]
    cells = rng.permutation(100)[:n]
    coords_um = np.stack([cells % 10, cells // 10], axis=1).astype(np.float32) * 256.0  # (N, 2)
    provenance = BagProvenance(
        slide_id=path.stem, encoder="test-encoder", weights_sha256="0" * 64, tile_um=256.0,
        tile_px=256, mpp=0.5, level0_width=5120, level0_height=5120,
        tile_params={"tile_um": 256.0, "tile_px": 256}, target_mpp=1.0, slide_path=slide_path or None,
    )  # fmt: skip
    write_bag(path, feats=feats, coords_um=coords_um, coords_px=(coords_um / 0.5).astype(np.int64),
              provenance=provenance)  # fmt: skip
    return n_b


def make_kind_cohort(
    root: Path,
    *,
    kind: str,
    n_patients: int,
    seed: int = 0,
    slides_per_patient: tuple[int, int] = (1, 1),
    missing: float = 0.0,
    tiles: tuple[int, int] = (16, 32),
) -> KindCohort:
    """Bags and a label table for `kind` (survival | regression | multi-target); patients get
    between slides_per_patient[0] and [1] slides; `missing` = share of label cells left blank
    (multi-target)."""
    rng = np.random.default_rng(seed)
    bags = root / "bags"
    bags.mkdir(parents=True, exist_ok=True)
    fraction: dict[str, float] = {}
    slides_of: dict[str, list[str]] = {}
    for p in range(n_patients):
        patient = f"P{p:03d}"
        n_b = n_all = 0
        target = rng.uniform(0.05, 0.95)
        slides_of[patient] = []
        for s in range(int(rng.integers(slides_per_patient[0], slides_per_patient[1] + 1))):
            slide = f"{patient}-S{s + 1}"
            n = int(rng.integers(*tiles))
            frac = float(np.clip(target + rng.normal(0, 0.05), 0, 1))
            n_b += texture_bag(bags / f"{slide}.h5", fraction=frac, n=n, rng=rng)
            n_all += n
            slides_of[patient].append(slide)
        fraction[patient] = n_b / n_all
    rows = [_row(kind, patient, fraction[patient], rng, missing) for patient in slides_of]
    labels = root / "labels.csv"
    out_rows = [{"slide": s, "patient": r["patient"], **{k: v for k, v in r.items() if k != "patient"}}
                for r in rows for s in slides_of[r["patient"]]]  # fmt: skip
    with labels.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(out_rows[0]))
        writer.writeheader()
        writer.writerows(out_rows)
    return KindCohort(bags, labels, fraction, slides_of, out_rows)


def _row(kind: str, patient: str, frac: float, rng: np.random.Generator, missing: float) -> dict[str, str]:
    if kind == "survival":
        t = rng.exponential(1.0 / (0.05 * np.exp(BETA * frac)))  # months
        c = rng.uniform(0.5, 15)  # about a quarter of the patients censored
        return {"patient": patient, "os_months": f"{min(t, c):.3f}", "os_event": str(int(t <= c))}
    if kind == "regression":
        return {"patient": patient, "purity": f"{100 * frac + rng.normal(0, 2):.3f}"}
    mutation = "mut" if frac > 0.5 else "wt"
    score = f"{10 * frac:.4f}"
    return {
        "patient": patient,
        "tp53": "" if rng.random() < missing else mutation,
        "tmb": "" if rng.random() < missing else score,
    }


TASKS = {
    "survival": {
        "kind": "survival",
        "survival": {"time": "os_months", "event": "os_event", "bags_per_step": 16},
    },
    "regression": {"kind": "regression", "targets": [{"column": "purity"}]},
    "multi-target": {
        "kind": "multi-target",
        "targets": [
            {"column": "tp53", "type": "categorical", "classes": ["wt", "mut"]},
            {"column": "tmb", "type": "continuous", "weight": 1.0},
        ],
    },
}


def write_kind_task(path: Path, kind: str, **changes: object) -> Path:
    """A task YAML of `kind` with a tiny model; `changes` replace top-level keys."""
    task: dict[str, object] = {
        "name": f"toy-{kind}",
        **TASKS[kind],
        "input": "bags",
        "recipe": "paper",  # the recipe these tests were written for (issue 14 made small-cohort the default)
        "model": {"preset": "vit-wsi", "attention": "seqnorm", "overrides": dict(TINY)},
        "optimizer": {"lr": 2.0e-3, "weight_decay": 1.0e-2, "schedule": "cosine"},
        "epochs": 12,
        "patience": 0,
        "seed": 7,
        "bootstrap": 100,
    }
    task.update(changes)
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    return path

"""The demo's survival study, beside its classification one: same slides, same bags, a Cox model.

The demo's two tissue textures stand for two tumours with different outcomes: each patient's overall
survival time is drawn from a Cox model whose hazard is `HAZARD_RATIO` times higher for the `LUSC`
texture, with uniform censoring, so the truth is known and the study costs no tiling or embedding of
its own. The packaged `nsclc-os` task trains on the classification demo's bags, and its run folder
holds the same files as any survival run (metrics.json with the C-index and the log-rank p,
report.html with the Kaplan-Meier curves, km.png).
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.files import write_csv_atomic
from wsi.pipelines.train import train

log = logging.getLogger(__name__)

#: hazard of the high-risk texture against the other one (log hazard ratio 1.8)
HAZARD_RATIO = 6.0
HIGH_RISK_CLASS = "LUSC"
BASELINE_MEDIAN_MONTHS = 36.0  # median survival of the low-risk texture
MAX_FOLLOW_UP_MONTHS = 60.0  # censoring uniform on (6, 60) months


@dataclass(frozen=True)
class SurvivalDemoResult:
    c_index: float | None  # test C-index (None when the test split has no comparable pair)
    logrank_p: float | None  # test log-rank p, high against low risk at the training median
    outputs: dict[str, Path]


def write_survival_labels(labels_csv: Path, out_csv: Path, *, seed: int) -> Path:
    """OS_MONTHS / OS_STATUS per patient of the demo's labels.csv (slide, label, patient)."""
    rng = np.random.default_rng(seed + 7919)
    with Path(labels_csv).open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    rate_low = np.log(2) / BASELINE_MEDIAN_MONTHS
    drawn: dict[str, tuple[str, int]] = {}  # patient -> (time, event): one draw per patient
    out = []
    for r in rows:
        if r["patient"] not in drawn:
            rate = rate_low * (HAZARD_RATIO if r["label"] == HIGH_RISK_CLASS else 1.0)
            time, censor = rng.exponential(1 / rate), rng.uniform(6.0, MAX_FOLLOW_UP_MONTHS)
            drawn[r["patient"]] = (f"{min(time, censor):.2f}", int(time <= censor))
        out.append([r["slide"], r["patient"], *drawn[r["patient"]]])
    write_csv_atomic(out_csv, ["slide", "patient", "OS_MONTHS", "OS_STATUS"], out)
    return out_csv


def run_survival_demo(
    *,
    features_dir: Path,
    labels_csv: Path,
    out_dir: Path,
    epochs: int = 15,
    seed: int = 0,
    model_overrides: Mapping[str, Any] | None = None,
) -> SurvivalDemoResult:
    """Survival labels for the demo's patients, then `nsclc-os` trained on the demo's bags into
    `out_dir`/survival-model (re-used when finished, continued when interrupted)."""
    labels = write_survival_labels(labels_csv, out_dir / "survival-labels.csv", seed=seed)
    run_dir = out_dir / "survival-model"
    if (run_dir / "metrics.json").is_file():
        log.info("survival demo: finished run found in %s, re-used", run_dir)
        metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    else:
        log.info("survival demo: training a Cox model (task nsclc-os) on the same bags")
        metrics = train(
            task="nsclc-os", features_dir=features_dir, labels_csv=labels, out_dir=run_dir, epochs=epochs,
            seed=seed, model_overrides=dict(model_overrides or {}), resume=True,
            overrides={
                "patience": epochs,  # a dozen training patients: keep every epoch's chance to improve
                "survival.bags_per_step": 8,
                "survival.auc_times": [],  # the quartiles of the demo's event times
                "input_options.bag_size": None,
            },
        ).metrics  # fmt: skip
    outputs = {
        "survival labels": labels,
        "survival run": run_dir,
        "survival metrics": run_dir / "metrics.json",
        "survival report": run_dir / "report.html",
        "Kaplan-Meier curves": run_dir / "km.png",
    }
    c, p = metrics.get("c_index"), metrics.get("logrank_p")
    return SurvivalDemoResult(
        c_index=None if c is None else float(c), logrank_p=None if p is None else float(p), outputs=outputs
    )


__all__ = ["SurvivalDemoResult", "run_survival_demo", "write_survival_labels"]

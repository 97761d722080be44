"""Score a fold's best weights once, on its test split (or on validation when the task keeps none).

Writes `<split>_predictions.csv`, `roc.png` and `metrics.json` into the run folder and returns what
metrics.json holds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipelines.checkpoints import load_into
from pipelines.inputs import InputAdapter
from pipelines.tasks import TaskConfig
from pipelines.train import metrics
from pipelines.train.loop import make_loader, predict_loader
from pipelines.train.splits import Split
from pipelines.train.state import TrainState
from wsi.files import write_csv_atomic, write_json_atomic

log = logging.getLogger(__name__)


def evaluate_best(
    *,
    task: TaskConfig,
    adapter: InputAdapter,
    split: Split,
    model: torch.nn.Module,
    run_dir: Path,
    device: torch.device,
    state: TrainState,
) -> dict[str, Any]:
    """Load best.safetensors into `model`, predict the held-out split and write its figures."""
    load_into(model, run_dir / "best.safetensors")
    eval_split, eval_items = ("test", split.test) if split.test else ("val", split.val)
    loader = make_loader(
        adapter, eval_items, train=False, batch_size=task.batch_size, num_workers=task.num_workers,
        device=device,
    )  # fmt: skip
    ids, labels, probs = predict_loader(model, loader, device=device)
    figures = metrics.evaluate(labels, probs, task.classes, n_bootstrap=task.bootstrap, seed=task.seed)
    _write_predictions(run_dir / f"{eval_split}_predictions.csv", ids, labels, probs, task.classes)
    metrics.plot_roc(labels, probs, task.classes, run_dir / "roc.png", title=f"{task.name}: {eval_split} ROC")
    result = metrics.json_safe(
        {
            "split": eval_split,
            **figures,
            "best_epoch": state.best_epoch,
            "epochs_run": state.epoch,
            "best_val_auroc": state.best_row().get("val_auroc"),
        }
    )
    write_json_atomic(run_dir / "metrics.json", result)
    lo, hi = figures["auroc_ci95"]
    log.info(
        "%s AUROC %s (95%% CI %s-%s), accuracy %s, balanced accuracy %s on %d slides",
        eval_split, _fmt(figures["auroc"]), _fmt(lo), _fmt(hi), _fmt(figures["accuracy"]),
        _fmt(figures["balanced_accuracy"]), figures["n"],
    )  # fmt: skip
    return result


def _write_predictions(
    path: Path, ids: list[str], labels: np.ndarray, probs: np.ndarray, classes: Sequence[str]
) -> None:
    header = ["slide", "label", *[f"prob_{c}" for c in classes], "predicted"]
    rows = (
        [sid, classes[labels[i]], *[f"{p:.6f}" for p in probs[i]], classes[int(probs[i].argmax())]]
        for i, sid in enumerate(ids)
    )
    write_csv_atomic(path, header, rows)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


__all__ = ["evaluate_best"]

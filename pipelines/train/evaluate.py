"""Score a fold's best weights once, on its test split (or on validation when the task keeps none).

Writes `<split>_predictions.csv`, `metrics.json`, the statistics report (`report.html` and the CSVs
behind it in `report/`) and the kind's main figure (`roc.png`, `scatter.png` or `km.png`) into the
run folder, and returns what metrics.json holds. A kind that reads something off the trained model's
training outputs (survival: the median risk that splits high from low risk) gets them first, and
fitted.json is written again with it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from wsi.core.files import write_json_atomic
from wsi.pipelines.inputs import InputAdapter, Item
from wsi.pipelines.report import write_report
from wsi.pipelines.runs.checkpoints import load_into
from wsi.pipelines.runs.record import write_fitted
from wsi.pipelines.stats.classification import json_safe, plot_roc
from wsi.pipelines.study.cases import make_loader
from wsi.pipelines.study.kinds import PredictionSet, TaskKind
from wsi.pipelines.study.tasks import TaskConfig
from wsi.pipelines.train.loop import Predicted, predict_loader
from wsi.pipelines.train.splits import Split
from wsi.pipelines.train.state import TrainState

log = logging.getLogger(__name__)


def evaluate_best(
    *,
    task: TaskConfig,
    kind: TaskKind,
    adapter: InputAdapter,
    split: Split,
    model: torch.nn.Module,
    run_dir: Path,
    device: torch.device,
    state: TrainState,
    label: str = "",
) -> dict[str, Any]:
    """Load best.safetensors into `model`, predict the held-out split and write its figures; `label`
    ("fold k/K") starts the log line of its figures."""
    load_into(model, run_dir / "best.safetensors")

    def predict(items: list[Item]) -> Predicted:
        loader = make_loader(
            adapter, items, train=False, batch_size=task.batch_size, num_workers=task.num_workers,
            device=device, n_targets=len(kind.target_names),
        )  # fmt: skip
        return predict_loader(model, loader, device=device, kind=kind)

    if kind.uses_training_outputs:
        kind.fit_outputs(predict(split.train).outputs)
        write_fitted(run_dir, kind.fitted())
    eval_split, eval_items = ("test", split.test) if split.test else ("val", split.val)
    note = _no_test_note(task, split)
    if note:
        log.warning("%s", note)
    pred = predict(eval_items)
    preds = PredictionSet(eval_split, pred.ids, pred.targets, pred.outputs)
    figures = kind.evaluate(preds, n_bootstrap=task.bootstrap, seed=task.seed)
    id_column = "patient" if task.level == "patient" else "slide"
    kind.write_predictions(run_dir / f"{eval_split}_predictions.csv", preds, id_column=id_column)
    if kind.name == "categorical":  # the ROC figure training has always drawn (other kinds: the report's)
        labels, title = preds.targets[:, 0].astype(int), f"{task.name}: {eval_split} ROC"
        if not plot_roc(labels, preds.outputs, task.classes, run_dir / "roc.png", title=title):
            (run_dir / "roc.png").unlink(missing_ok=True)  # a resumed run's older figure is not this one
            log.warning(
                "no ROC curve: the %s split's %d case(s) hold only one class, too few for an AUROC; "
                "use a larger split or --cv", eval_split, len(preds),
            )  # fmt: skip
    best = state.best_row()
    if kind.name == "categorical":
        best_val = {"best_val_auroc": best.get("val_auroc")}
    else:
        best_val = {f"best_{c}": best.get(c) for c in ("val_loss", *kind.val_columns)}
    result = json_safe(
        {"split": eval_split, "kind": kind.name, **figures, "best_epoch": state.best_epoch,
         "epochs_run": state.epoch, **best_val, **({"note": note} if note else {})}
    )  # fmt: skip
    write_json_atomic(run_dir / "metrics.json", result)
    write_report(
        run_dir,
        kind=kind,
        sets=[preds],
        metrics={eval_split: result},
        title=f"{task.name}: {eval_split} split",
    )
    unit = "patients" if task.level == "patient" else "slides"
    log.info("%s%s %s on %d %s", f"{label}: " if label else "", eval_split, kind.summary_line(result),
             len(preds), unit)  # fmt: skip
    return dict(result)



def _no_test_note(task: TaskConfig, split: Split) -> str:
    """Why the figures are on the validation split, when the task asked for a test split that came out
    empty ("" when there is a test split, or the task set split.test to 0 on purpose)."""
    if split.test or task.split.test == 0:
        return ""
    unit = "patients" if task.level == "patient" else "slides"
    n = len(split.train) + len(split.val)
    return (
        f"the test split is empty: {n} {unit} are too few for split.test {task.split.test:g} (each split "
        "takes whole patients, per class); the figures are on the validation split, which also chose the "
        "best epoch, so they are optimistic. Give more cases, raise split.test, or use --cv"
    )

__all__ = ["evaluate_best"]

"""`wsi train`: train an attention MIL model (or an image ViT) for a task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from wsi.cli._common import ensure_writable_dir, user_errors
from wsi.cli._locations import PathOrUrl
from wsi.cli._options import config_options
from wsi.pipelines.train.config import TrainOptions
from wsi.storage import Url

# option -> TrainOptions field: defaults, ranges, choices and help come from the fields
# (pipelines/train/config.py)
TRAIN_FLAGS = {
    "--features": "features_dir", "--images": "images_dir", "--attention": "attention", "--preset": "preset",
    "--recipe": "recipe",
    "--device": "device", "--epochs": "epochs", "--seed": "seed", "--batch-size": "batch_size",
    "--grad-accum": "grad_accum", "--bag-size": "bag_size", "--num-workers": "num_workers",
    "--standardize-features": "standardize_features", "--cv": "cv", "--scheduler": "scheduler",
    "--resume": "resume", "--init-from": "init_from", "--allow-unfinished": "allow_unfinished",
    "--mpp": "mpp", "--progress": "progress",
}  # fmt: skip


@click.command(
    "train",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  wsi train --task nsclc-subtype --features run/features/retccl --labels labels.csv --out model/
  wsi train --task nsclc-subtype --features bags/ --labels labels.csv --out cmp/sima --attention sima
  wsi train --task my-task.yaml --features bags/ --labels labels.csv --out model/ --cv 5
  wsi train --task my-task.yaml --features bags/ --labels labels.csv --out z/ --standardize-features
  wsi train --task nsclc-subtype ... --cv 5 --scheduler tcp://10.0.0.5:8786   # folds in parallel
  wsi train --task nsclc-subtype ... --out model/ --resume                     # after an interruption
  wsi train --task nsclc-subtype ... --init-from softmax-run/ --attention seqnorm
  wsi train --task isic-melanoma --images isic/ --labels isic/train.csv --out derm-model/   # images
  wsi train --task nsclc-os --features bags/ --labels clinical.csv --out os-model/   # survival (Cox)
  wsi train --task tumor-purity --features bags/ --labels purity.csv --out purity/   # regression
  wsi train --task nsclc-mutations --features bags/ --labels panel.csv --out panel/  # multi-target
  wsi train --task my-task.yaml --features clam/h5_files --labels labels.csv --out m/ --mpp 0.25  # CLAM
  wsi train --task nsclc-subtype --features run/feather-slide --labels labels.csv --out probe/ --cv 5
  wsi train --task nsclc-subtype --features run/chief-slide --labels l.csv --out m/ --preset mlp
  wsi train --task my-task.yaml --features bags/ --labels labels.csv --out clam/ --cv 5 --preset clam-sb
  wsi train --task nsclc-subtype --features bags/ --labels l.csv --out t/ --preset transmil --recipe authors

\b
Labels CSV: a slide column (slide id or file name), the task's label column(s) (categorical: the
class; regression and multi-target: each target's column, blank = missing; survival: time and event),
optionally a patient column (else the first 12 characters of a TCGA barcode, else the slide id).
Patient-level tasks (level: patient) may give one row per patient and no slide column. Slides without
a bag and bags without a label are counted, reported and left out. An optional `mpp` column gives a
slide's level-0 um/px (wins over --mpp).

\b
Before training, every bag is checked: one with NaN or infinite features, an unreadable or empty one,
or (for a model that uses tile positions) one in level-0 pixels with no resolution stops the run with
exit code 2 and a list of every such bag; nothing is trained. A loss or gradient that turns NaN while
training stops the run (exit 2) naming the bags of that step.

\b
Output (under --out): config.json, fitted.json (non-categorical tasks), splits.csv, log.csv (per
epoch), best.safetensors, last.safetensors, resume/, test_predictions.csv, metrics.json (the task's
test figures with 95% CIs: AUROC, accuracy, ...; Pearson r, R^2, ...; C-index, time-dependent AUC,
log-rank p), report.html + report/*.csv (the statistics report), roc.png | scatter.png | km.png.
With --cv K: fold-<k>/ run folders, and at the top metrics.json with the mean and standard deviation
of each figure and the pooled figures, and report.html with per-fold and pooled curves.
""",
)
@click.option("--task", required=True, help="Packaged task name (e.g. nsclc-subtype) or a task YAML path.")
@click.option(
    "--labels",
    "labels_csv",
    required=True,
    type=PathOrUrl(dir_okay=False),
    help="Label table (CSV), or its URL.",
)
@click.option(
    "--out", "out_dir", required=True, type=PathOrUrl(file_okay=False),
    help="Run folder, or its URL (written locally, uploaded after every epoch and at the end).",
)
@config_options(TrainOptions, TRAIN_FLAGS, into="settings")
@user_errors
def command(task: str, labels_csv: Path | Url, out_dir: Path | Url, settings: dict[str, Any]) -> None:
    """Train a model for TASK on labelled feature bags (or images) and test it."""
    from wsi.core.config import parse_config

    options = parse_config(TrainOptions, settings, source="wsi train options")  # exit 2 when refused
    ensure_writable_dir(out_dir)  # before any work: a read-only --out is exit 2, not a late traceback
    from wsi.pipelines.train import train

    result = train(task, labels_csv=labels_csv, out_dir=out_dir, options=options)
    _report(result)


def _report(result: Any) -> None:
    """The run's headline figure and where its files are."""
    from wsi.pipelines.runs.record import read_run_record
    from wsi.pipelines.train import CvMetrics
    from wsi.storage import origin

    shown = origin(result.run_dir)  # a remote --out: its URL, not this machine's copy
    kind, m = result.kind, result.metrics
    if isinstance(m, CvMetrics):
        key = kind.summary_keys[0]
        name = "AUROC" if key == "auroc" else key
        a = m.summary[key]
        where = f"results in {shown}/metrics.json"
        click.echo(f"{m.folds}-fold {name} {_f(a.mean)} +- {_f(a.std)}; {where}")
        pooled = kind.summary_line(m.pooled)
        click.echo(f"pooled over the folds: {pooled}; report: {shown}/report.html")
        return
    unit = "patients" if read_run_record(result.run_dir).task.level == "patient" else "slides"
    click.echo(f"{m.split} {kind.summary_line(m.figures)} on {m.n} {unit}; best epoch {m.best_epoch}")
    if m.note:  # e.g. an empty test split: the figures are the validation split's
        click.echo(f"note: {m.note}")
    figure = {"regression": "scatter.png", "survival": "km.png"}.get(kind.name, "roc.png")
    drawn = f"{figure}, " if (result.run_dir / figure).is_file() else ""  # no ROC from one class
    files = f"best.safetensors, metrics.json, report.html, {drawn}log.csv"
    click.echo(f"run folder: {shown} ({files})")


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"

"""`wsi train`: train an attention MIL model (or an image ViT) for a task."""

from __future__ import annotations

from pathlib import Path

import click

from wsi.cli._common import ensure_writable_dir, mpp_option, scheduler_option, user_errors
from wsi.cli._options import field_type
from wsi.pipelines.run_record import RunRecord
from wsi.pipelines.tasks import MAX_BAG_SIZE, TaskConfig


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
    "--features",
    "features_dir",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Folder of feature bags (wsi embed, STAMP, CLAM, TRIDENT) for `input: bags` tasks.",
)
@click.option(
    "--images",
    "images_dir",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Folder of images for `input: images` tasks.",
)
@click.option(
    "--labels",
    "labels_csv",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Label table (CSV).",
)
@click.option(
    "--out", "out_dir", required=True, type=click.Path(path_type=Path, file_okay=False), help="Run folder."
)
@click.option(
    "--attention",
    type=click.Choice(["seqnorm", "softmax", "sima", "gdla"]),
    default=None,
    help="Attention variant [default: the task's].",
)
@click.option(
    "--preset", "model_preset", default=None,
    help="Model preset: vit-wsi, vit-wsi-small, abmil; the authors' transmil, clam-sb, clam-mb, dsmil, dtfd "
    "(the last four: categorical tasks); linear or mlp on slide embeddings [default: the task's; linear "
    "when --features holds slide embeddings].",
)  # fmt: skip
@click.option(
    "--device", default="auto", show_default=True, help="auto (CUDA, MPS, CPU), cpu, cuda, cuda:N, mps."
)
@click.option(
    "--epochs",
    type=field_type(TaskConfig, "epochs"),
    default=None,
    help="Maximum epochs [default: the task's].",
)
@click.option(
    "--seed", type=field_type(TaskConfig, "seed"), default=None, help="Random seed [default: the task's]."
)
@click.option(
    "--batch-size",
    type=field_type(TaskConfig, "batch_size"),
    default=None,
    help="Bags per step [default: the task's].",
)
@click.option(
    "--grad-accum",
    type=field_type(TaskConfig, "grad_accum"),
    default=None,
    help="Batches per optimizer step.",
)
@click.option(
    "--bag-size",
    type=click.IntRange(min=1, max=MAX_BAG_SIZE),
    default=None,
    help="Train on random subsets of at most this many tiles per bag (augmentation; off by default).",
)
@click.option(
    "--num-workers",
    type=field_type(TaskConfig, "num_workers"),
    default=None,
    help="Background processes reading bags (GPU training: 2-8) [default: the task's].",
)
@click.option(
    "--standardize-features/--no-standardize-features",
    default=None,
    help="Z-score each input feature with the training split's tile mean and sd (stored with the model, "
    "applied in validation, test and predict) [default: the task's standardize_features].",
)
@click.option(
    "--cv", type=field_type(RunRecord, "cv"), default=None, help="K-fold cross-validation (patient-grouped)."
)
@scheduler_option("Run the --cv folds in parallel on a dask.distributed cluster (e.g. tcp://host:8786).")
@click.option("--resume", is_flag=True, help="Continue an interrupted run in --out from its last epoch.")
@click.option(
    "--init-from",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Start from a run folder or .safetensors (softmax weights are transferred to --attention).",
)
@mpp_option(
    "Level-0 um/px of the slides behind bags that store pixel coordinates (CLAM, TRIDENT); needed only "
    "when the model uses tile positions. An `mpp` column in --labels wins per slide."
)
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@user_errors
def command(
    task: str,
    features_dir: Path | None,
    images_dir: Path | None,
    labels_csv: Path,
    out_dir: Path,
    attention: str | None,
    model_preset: str | None,
    device: str,
    epochs: int | None,
    seed: int | None,
    batch_size: int | None,
    grad_accum: int | None,
    bag_size: int | None,
    num_workers: int | None,
    standardize_features: bool | None,
    cv: int | None,
    scheduler: str | None,
    resume: bool,
    init_from: Path | None,
    mpp: float | None,
    no_progress: bool,
) -> None:
    """Train a model for TASK on labelled feature bags (or images) and test it."""
    if scheduler and not cv:
        raise click.UsageError("--scheduler runs cross-validation folds in parallel; give --cv K too")
    ensure_writable_dir(out_dir)  # before any work: a read-only --out is exit 2, not a late traceback
    from wsi.pipelines.train import train

    overrides: dict[str, object] = {}
    if bag_size is not None:
        overrides["input_options.bag_size"] = bag_size
    if num_workers is not None:
        overrides["num_workers"] = num_workers
    if model_preset is not None:
        overrides["model.preset"] = model_preset
    if standardize_features is not None:
        overrides["standardize_features"] = standardize_features
    result = train(
        task=task, labels_csv=labels_csv, out_dir=out_dir, features_dir=features_dir, images_dir=images_dir,
        attention=attention, device=device, cv=cv, scheduler=scheduler, resume=resume, init_from=init_from,
        epochs=epochs, seed=seed, batch_size=batch_size, grad_accum=grad_accum,
        overrides=overrides or None, progress=not no_progress, mpp=mpp,
    )  # fmt: skip
    from wsi.pipelines.run_record import read_run_record

    record = read_run_record(result.run_dir)
    kind = result.kind
    m = result.metrics
    if cv:
        key = kind.summary_keys[0]
        a = m[key]
        name = "AUROC" if key == "auroc" else key
        click.echo(
            f"{cv}-fold {name} {_f(a['mean'])} +- {_f(a['std'])}; results in {result.run_dir}/metrics.json"
        )
        pooled = kind.summary_line(m["pooled"])
        click.echo(f"pooled over the folds: {pooled}; report: {result.run_dir}/report.html")
    else:
        unit = "patients" if record.task.level == "patient" else "slides"
        click.echo(f"{m['split']} {kind.summary_line(m)} on {m['n']} {unit}; best epoch {m['best_epoch']}")
        if m.get("note"):  # e.g. an empty test split: the figures are the validation split's
            click.echo(f"note: {m['note']}")
        figure = {"regression": "scatter.png", "survival": "km.png"}.get(kind.name, "roc.png")
        drawn = f"{figure}, " if (result.run_dir / figure).is_file() else ""  # no ROC from one class
        files = f"best.safetensors, metrics.json, report.html, {drawn}log.csv"
        click.echo(f"run folder: {result.run_dir} ({files})")


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"

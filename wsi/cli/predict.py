"""`wsi predict`: batch inference with a trained run, from raw slides or from feature bags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from wsi.cli._common import EXIT_PARTIAL_FAILURE, ensure_writable_dir, user_errors
from wsi.cli._locations import PathOrUrl
from wsi.cli._options import config_options
from wsi.pipelines.predict.config import PredictOptions
from wsi.storage import Url

# option -> PredictOptions field: defaults, ranges and help come from the fields (pipelines/predict/config.py)
PREDICT_FLAGS = {
    "--weights": "weights", "--slide-weights": "slide_weights", "--mpp": "mpp", "--backend": "backend",
    "--device": "device",
    "--workers": "workers", "--scheduler": "scheduler", "--labels": "labels_csv", "--top-tiles": "top_tiles",
    "--heatmaps": "heatmaps", "--geojson": "geojson", "--stream-above-tiles": "stream_above_tiles",
    "--overwrite": "overwrite", "--progress": "progress", "--allow-unfinished": "allow_unfinished",
}  # fmt: skip


@click.command(
    "predict",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  wsi predict --model model/ new-slides/ --out preds/ --weights best_ckpt.pth   # raw slides
  wsi predict --model model/ slides.csv --out preds/ --weights best_ckpt.pth    # CSV: path[,slide_id][,mpp]
  wsi predict --model model/ --features run/features/retccl --out preds/       # bags
  wsi predict --model cv-run/ --features bags/ --out preds/    # cross-validation run: mean of the folds
  wsi predict --model model/ --features ext/ --labels ext.csv --out val/   # external validation + report
  wsi predict --model model/ slides/ --weights w.pth --out preds/ --top-tiles 8   # + top tiles per slide
  wsi predict --model probe/ slides/ --weights conch.bin --slide-weights feather/ --out preds/  # slide enc.

\b
Raw slides are tiled and embedded with the exact settings the run recorded (tile size, MPP, every
tiling parameter, encoder and the sha256 of its weights; --weights must match it). Bags from another
encoder or weights, or with another stain normalisation than the training bags, are refused (raw slides
of a stain-normalised run too, for now: embed them with the same --stain-norm). --weights is refused
where no encoder runs (bags, images, a run whose encoder was random). Bags in level-0 pixels (CLAM,
TRIDENT) get their resolution as in training: an `mpp` column in --labels, else --mpp, else the run's
recorded one.

\b
Results are written as slides finish (predictions.csv, manifest.csv, predict_progress.jsonl); a re-run
into the same --out skips slides already predicted with the same model, inputs and options
(--overwrite redoes them). A slide with NaN features or outputs fails in the manifest; a raw slide
that kept no tile shows there as `empty`, with the tiling's reason. A bag of more tiles than
--stream-above-tiles is read from its file chunk by chunk (a million tiles in under 3 GB of memory,
the same probabilities); per-tile contributions need it whole, so it gets no heatmap (manifest note).

\b
Output (under --out): predictions.csv (slide, or patient for patient-level runs, then the outputs:
prob_<class>..., predicted | pred_<target> | risk, risk_group), patient_predictions.csv (slide-level
runs: the mean over each patient's slides, when a patient has several or --labels is given),
manifest.csv (every slide's status, error and note), heatmaps/<slide>.png (each tile's contribution to the
predicted class, target or risk), geojson/<slide>.geojson (every tile as a QuPath object in level-0
px with its contributions and pooling weight, the top tiles as annotations, the prediction: QuPath's
File > Import objects opens it), and for raw slides work/ (tile files and bags).
--labels CSV (a label table as for training): metrics.json (the task's figures with 95% CIs),
external_predictions.csv, report.html and report/*.csv, as training writes for its test split.
--top-tiles K: top_tiles/<slide>/ crops of the K tiles pushing each output most and least, read from
the slide (raw slides, or the slide path a bag records; slides not reachable are listed in
top_tiles/skipped.csv), with a contact_sheet.png, and top_tiles/index.csv.

\b
Exit code: 0 all slides predicted, 1 some failed or were empty (see manifest.csv), 2 a usage error
(also a read-only --out, found before any work).
""",
)
@click.argument("paths", nargs=-1, type=PathOrUrl())
@click.option(
    "--model",
    "model_dir",
    required=True,
    type=PathOrUrl(exists=True, file_okay=False),
    help="Run folder written by `wsi train` (or its URL).",
)
@click.option(
    "--features",
    "features_dir",
    type=PathOrUrl(exists=True),
    default=None,
    help="Predict these bags instead of raw slides (a folder or its URL).",
)
@click.option(
    "--out", "out_dir", required=True, type=PathOrUrl(file_okay=False), help="Output folder (or URL)."
)
@config_options(PredictOptions, PREDICT_FLAGS, into="settings")
@user_errors
def command(
    paths: tuple[Path | Url, ...],
    model_dir: Path | Url,
    features_dir: Path | Url | None,
    out_dir: Path | Url,
    settings: dict[str, Any],
) -> None:
    """Predict slides (PATHS: slides, folders, CSV lists) or bags (--features) with a trained run."""
    if bool(paths) == (features_dir is not None):
        raise click.UsageError("give slide PATHS or --features DIR (one of the two)")
    ensure_writable_dir(out_dir)  # before any work: a read-only --out is exit 2, not a late traceback
    from wsi.core.config import parse_config
    from wsi.pipelines.predict.stage import predict
    from wsi.storage import local_view, origin

    options = parse_config(PredictOptions, settings, source="wsi predict options")
    result = predict(
        model_dir=model_dir, out_dir=out_dir, inputs=paths, features_dir=features_dir, options=options
    )
    failed = result.problems  # failed and empty slides: both make the exit code 1
    noun = f"{result.level}(s)"
    n_empty = len(result.summary.empty)
    empty = f", {n_empty} empty (kept no tile)" if n_empty else ""
    n_skipped = result.summary.counts.get("skipped", 0)  # finished by an earlier call into --out
    again = f", {n_skipped} already predicted (--overwrite redoes them)" if n_skipped else ""
    counts = f"{len(result.rows) - n_skipped} {noun} predicted{again}, {len(failed) - n_empty} failed{empty}"
    click.echo(f"{counts}: {origin(result.predictions_csv)}")
    if result.metrics is not None:
        from wsi.pipelines.runs.record import read_run_record
        from wsi.pipelines.study.kinds import build_kind

        kind = build_kind(read_run_record(local_view(model_dir)).task)
        line = kind.summary_line(result.metrics)
        click.echo(f"external validation: {line}; report: {out_dir / 'report.html'}")
    for r in failed[:10]:
        click.echo(f"  {r.status} {r.slide_id}: {r.error}", err=True)
    if failed:
        raise SystemExit(EXIT_PARTIAL_FAILURE)

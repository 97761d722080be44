"""`wsi predict`: batch inference with a trained run, from raw slides or from feature bags."""

from __future__ import annotations

from pathlib import Path

import click

from wsi.cli._common import (
    EXIT_PARTIAL_FAILURE,
    backend_option,
    ensure_writable_dir,
    mpp_option,
    scheduler_option,
    user_errors,
    workers_option,
)


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
predicted class, target or risk), and for raw slides work/ (tile files and bags).
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
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--model",
    "model_dir",
    required=True,
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    help="Run folder written by `wsi train`.",
)
@click.option(
    "--features",
    "features_dir",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Predict these bags instead of raw slides.",
)
@click.option(
    "--out", "out_dir", required=True, type=click.Path(path_type=Path, file_okay=False), help="Output folder."
)
@click.option(
    "--weights",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="Encoder weights for raw slides (must match the run's recorded sha256).",
)
@click.option(
    "--slide-weights", type=click.Path(path_type=Path, exists=True), default=None,
    help="Slide-encoder weights for raw slides, for a run trained on slide embeddings (sha256 checked).",
)  # fmt: skip
@mpp_option(
    "Level-0 um/px for slides whose metadata has none, and for bags in level-0 pixels (CLAM, TRIDENT) "
    "[default: the run's]."
)
@backend_option()
@click.option(
    "--device", default="auto", show_default=True, help="auto (CUDA, MPS, CPU), cpu, cuda, cuda:N, mps."
)
@workers_option("Slides tiled/embedded in parallel (local dask workers).")
@scheduler_option("Tile/embed on a dask.distributed cluster.")
@click.option(
    "--labels",
    "labels_csv",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Label table of this cohort: score the predictions (external validation) and write the report.",
)
@click.option(
    "--top-tiles",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Save the K tiles pushing each class (or risk) most and least per slide, with a contact sheet.",
)
@click.option("--no-heatmaps", is_flag=True, help="Skip the per-slide heatmaps.")
@click.option(
    "--stream-above-tiles",
    type=click.IntRange(min=1),
    default=131_072,
    show_default=True,
    help="Read a slide's bag of more tiles from its file chunk by chunk: the same prediction in bounded "
    "memory, but no heatmap or top tiles for it (the manifest's note says so).",
)
@click.option(
    "--overwrite", is_flag=True, help="Predict every slide again, also those finished by a run into --out."
)
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@user_errors
def command(
    paths: tuple[Path, ...],
    model_dir: Path,
    features_dir: Path | None,
    out_dir: Path,
    weights: Path | None,
    slide_weights: Path | None,
    mpp: float | None,
    backend: str,
    device: str,
    workers: int,
    scheduler: str | None,
    labels_csv: Path | None,
    top_tiles: int,
    no_heatmaps: bool,
    stream_above_tiles: int,
    overwrite: bool,
    no_progress: bool,
) -> None:
    """Predict slides (PATHS: slides, folders, CSV lists) or bags (--features) with a trained run."""
    if bool(paths) == (features_dir is not None):
        raise click.UsageError("give slide PATHS or --features DIR (one of the two)")
    ensure_writable_dir(out_dir)  # before any work: a read-only --out is exit 2, not a late traceback
    from pipelines.predict import predict

    result = predict(
        model_dir=model_dir, out_dir=out_dir, inputs=paths, features_dir=features_dir, device=device,
        heatmaps=not no_heatmaps, weights=weights, mpp=mpp, backend=backend, workers=workers,
        scheduler=scheduler, progress=not no_progress, labels_csv=labels_csv, top_tiles=top_tiles,
        overwrite=overwrite, stream_above_tiles=stream_above_tiles, slide_weights=slide_weights,
    )  # fmt: skip
    failed = result.problems  # failed and empty slides: both make the exit code 1
    noun = "patient(s)" if result.rows and "patient" in result.rows[0] else "slide(s)"
    n_empty = len(result.summary.empty)
    empty = f", {n_empty} empty (kept no tile)" if n_empty else ""
    counts = f"{len(result.rows)} {noun} predicted, {len(failed) - n_empty} failed{empty}"
    click.echo(f"{counts}: {result.predictions_csv}")
    if result.metrics is not None:
        from pipelines.kinds import build_kind
        from pipelines.run_record import read_run_record

        kind = build_kind(read_run_record(model_dir).task)
        line = kind.summary_line(result.metrics)
        click.echo(f"external validation: {line}; report: {out_dir / 'report.html'}")
    for r in failed[:10]:
        click.echo(f"  {r.status} {r.slide_id}: {r.error}", err=True)
    if failed:
        raise SystemExit(EXIT_PARTIAL_FAILURE)

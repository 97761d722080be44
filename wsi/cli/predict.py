"""`wsi predict`: batch inference with a trained run, from raw slides or from feature bags."""

from __future__ import annotations

from pathlib import Path

import click

from wsi.cli._common import (
    EXIT_PARTIAL_FAILURE,
    backend_option,
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

\b
Raw slides are tiled and embedded with the exact settings the run recorded (tile size, MPP, every
tiling parameter, encoder and the sha256 of its weights; --weights must match it). Bags from another
encoder or weights are refused.

\b
Output (under --out): predictions.csv (slide, prob_<class>..., predicted), manifest.csv (every slide's
status and error), heatmaps/<slide>.png (each tile's contribution to the predicted class), and for
raw slides work/ (tile files and bags).

\b
Exit code: 0 all slides predicted, 1 some failed (see manifest.csv), 2 a usage error.
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
@mpp_option("Level-0 um/px for slides whose metadata has none.")
@backend_option()
@click.option(
    "--device", default="auto", show_default=True, help="auto (CUDA, MPS, CPU), cpu, cuda, cuda:N, mps."
)
@workers_option("Slides tiled/embedded in parallel (local dask workers).")
@scheduler_option("Tile/embed on a dask.distributed cluster.")
@click.option("--no-heatmaps", is_flag=True, help="Skip the per-slide heatmaps.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@user_errors
def command(
    paths: tuple[Path, ...],
    model_dir: Path,
    features_dir: Path | None,
    out_dir: Path,
    weights: Path | None,
    mpp: float | None,
    backend: str,
    device: str,
    workers: int,
    scheduler: str | None,
    no_heatmaps: bool,
    no_progress: bool,
) -> None:
    """Predict slides (PATHS: slides, folders, CSV lists) or bags (--features) with a trained run."""
    from pipelines.predict import predict

    if bool(paths) == (features_dir is not None):
        raise click.UsageError("give slide PATHS or --features DIR (one of the two)")
    result = predict(
        model_dir=model_dir, out_dir=out_dir, inputs=paths, features_dir=features_dir, device=device,
        heatmaps=not no_heatmaps, weights=weights, mpp=mpp, backend=backend, workers=workers,
        scheduler=scheduler, progress=not no_progress,
    )  # fmt: skip
    failed = result.failed
    click.echo(f"{len(result.rows)} slide(s) predicted, {len(failed)} failed: {result.predictions_csv}")
    for r in failed[:10]:
        click.echo(f"  failed {r.slide_id}: {r.error}", err=True)
    if failed:
        raise SystemExit(EXIT_PARTIAL_FAILURE)

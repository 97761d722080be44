"""`wsi demo`: the whole pipeline on generated sample slides."""

from __future__ import annotations

from pathlib import Path

import click

from wsi.cli._common import ensure_writable_dir, user_errors
from wsi.config import MAX_SEED


@click.command(
    "demo",
    epilog="""\b
Examples:
  wsi demo --out demo-out/                        # ~20 generated slides, a few minutes on 2 cores
  wsi demo --out demo-out/ --weights best_ckpt.pth  # real RetCCL features
  wsi demo --out small/ --slides-per-class 4 --encoder timm:resnet18 --epochs 3
"""
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("demo-out"),
              show_default=True, help="Folder for every output (re-using it resumes finished stages).")
@click.option("--weights", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="RetCCL checkpoint (best_ckpt.pth); without it the encoder is randomly initialised.")
@click.option("--encoder", default="retccl", show_default=True, help="Encoder name (retccl or timm:<name>).")
@click.option("--slides-per-class", type=click.IntRange(4, 200), default=10, show_default=True)
@click.option("--epochs", type=click.IntRange(1, 1000), default=15, show_default=True)
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Slides processed in parallel (dask worker processes).")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True)
@user_errors
def command(out_dir: Path, weights: Path | None, encoder: str, slides_per_class: int, epochs: int,
            workers: int, seed: int) -> None:
    """Run tile -> embed -> train -> predict on a generated two-class cohort and say where it all went."""
    from wsi.pipelines.demo import DemoOptions, run_demo

    ensure_writable_dir(out_dir)  # exit 2 with the folder named, before any slide is generated
    if weights is None:
        click.echo(
            f"Note: no --weights given: {encoder} is randomly initialised (features are not RetCCL's).",
            err=True,
        )
    options = DemoOptions(
        out_dir=out_dir, weights=weights, encoder=encoder, slides_per_class=slides_per_class,
        epochs=epochs, workers=workers, seed=seed,
    )  # fmt: skip
    result = run_demo(options)
    auroc = "n/a (one class in the test split)" if result.test_auroc is None else f"{result.test_auroc:.3f}"
    click.echo(f"\nDemo finished in {result.seconds:.0f} s. Test AUROC: {auroc}")
    c = "n/a (too few events)" if result.survival_c_index is None else f"{result.survival_c_index:.3f}"
    click.echo(f"Survival study (Cox, task nsclc-os, same bags): test C-index {c}")
    for name, path in result.outputs.items():
        click.echo(f"  {name:<18} {path}")

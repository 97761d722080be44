"""`wsi demo`: the whole pipeline on generated sample slides."""

from __future__ import annotations

from typing import Any

import click

from wsi.cli._common import ensure_writable_dir, user_errors
from wsi.cli._options import config_options
from wsi.pipelines.demo.run import DemoOptions

# option -> DemoOptions field: defaults, ranges and help come from the fields (pipelines/demo/run.py)
DEMO_FLAGS = {
    "--out": "out_dir", "--weights": "weights", "--encoder": "encoder",
    "--slides-per-class": "slides_per_class", "--epochs": "epochs", "--workers": "workers", "--seed": "seed",
}  # fmt: skip


@click.command(
    "demo",
    epilog="""\b
Examples:
  wsi demo --out demo-out/                        # ~20 generated slides, a few minutes on 2 cores
  wsi demo --out demo-out/ --weights best_ckpt.pth  # real RetCCL features
  wsi demo --out small/ --slides-per-class 4 --encoder timm:resnet18 --epochs 3
""",
)
@config_options(DemoOptions, DEMO_FLAGS, into="settings")
@user_errors
def command(settings: dict[str, Any]) -> None:
    """Run tile -> embed -> train -> predict on a generated two-class cohort and say where it all went."""
    from wsi.core.config import parse_config
    from wsi.pipelines.demo.run import run_demo

    options = parse_config(DemoOptions, settings, source="wsi demo options")
    ensure_writable_dir(options.out_dir)  # exit 2 with the folder named, before any slide is generated
    if options.weights is None:
        click.echo(
            f"Note: no --weights given: {options.encoder} is randomly initialised (features are not "
            "RetCCL's).",
            err=True,
        )
    result = run_demo(options)
    auroc = "n/a (one class in the test split)" if result.test_auroc is None else f"{result.test_auroc:.3f}"
    click.echo(f"\nDemo finished in {result.seconds:.0f} s. Test AUROC: {auroc}")
    c = "n/a (too few events)" if result.survival_c_index is None else f"{result.survival_c_index:.3f}"
    click.echo(f"Survival study (Cox, task nsclc-os, same bags): test C-index {c}")
    if result.planted:
        click.echo(f"Planted on purpose: {result.planted}")
    for name, path in result.outputs.items():
        click.echo(f"  {name:<18} {path}")

"""`wsi make-slides`: write generated pyramidal sample slides to try the pipeline without real data."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from wsi.cli._common import user_errors
from wsi.cli._locations import LocalPath
from wsi.cli._options import config_options
from wsi.synthetic.scene import CohortSettings

# option -> CohortSettings field: defaults, ranges, choices and help come from the fields (synthetic/scene.py)
COHORT_FLAGS = {
    "--n": "n", "--size-um": "size_um", "--mpp": "mpp", "--style": "styles", "--texture": "texture",
    "--seed": "seed", "--prefix": "prefix", "--tile-px": "tile_px", "--with-mpp/--no-mpp": "write_mpp",
}  # fmt: skip


@click.command(
    "make-slides",
    epilog="""\b
Examples:
  wsi make-slides --out slides/                          # 4 slides of 1.5 x 1.5 mm at 0.5 um/px
  wsi make-slides --out slides/ --n 8 --style a --style b   # two tissue classes, alternating
  wsi make-slides --out big/ --n 1 --size-um 10000 --mpp 0.25 --texture auto   # 40,000 px square
  wsi make-slides --out nompp/ --n 1 --no-mpp            # a slide that needs --mpp downstream
""",
)
@click.option("--out", "out_dir", required=True, type=LocalPath(file_okay=False),
              help="Folder for the slides (created); also gets slides.json describing each one.")  # fmt: skip
@config_options(CohortSettings, COHORT_FLAGS, into="cohort")
@user_errors
def command(out_dir: Path, cohort: dict[str, Any]) -> None:
    """Write generated pyramidal, JPEG-compressed Aperio-style TIFF slides with tissue, blank
    background and a blurred region at known places (listed in OUT/slides.json, in micrometres)."""
    from wsi.core.config import parse_config
    from wsi.core.errors import ConfigError
    from wsi.synthetic import write_sample_cohort

    settings = parse_config(CohortSettings, cohort, source="wsi make-slides options")  # ConfigError: exit 2
    try:
        slides = write_sample_cohort(out_dir, **dataclasses.asdict(settings), progress=settings.n > 1)
    except FileNotFoundError as exc:  # --texture real without the source slide
        raise ConfigError(f"--texture real: {exc}") from None
    s = slides[0]
    click.echo(
        f"wrote {len(slides)} slide(s) of {s.width_px}x{s.height_px} px at {settings.mpp} um/px "
        f"({s.texture} texture) to {out_dir}; scenes in {out_dir / 'slides.json'}"
    )

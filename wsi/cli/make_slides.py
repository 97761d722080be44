"""`wsi make-slides`: write generated pyramidal sample slides to try the pipeline without real data."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import click

from wsi.cli._common import user_errors
from wsi.cli._options import FiniteFloatRange
from wsi.config import MAX_SEED

MAX_SLIDES = 10_000
MAX_SIDE_UM = 100_000.0  # 10 cm: beyond any glass slide (75 x 25 mm)


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
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the slides (created); also gets slides.json describing each one.")
@click.option("--n", "n", default=4, show_default=True, type=click.IntRange(1, MAX_SLIDES),
              help="Number of slides.")
@click.option("--size-um", "size_um", default=1500.0, show_default=True,
              type=FiniteFloatRange(1.0, MAX_SIDE_UM),
              help="Side of each (square) slide in micrometres.")
@click.option("--mpp", default=0.5, show_default=True, type=FiniteFloatRange(min=0.01, max=50.0),
              help="Level-0 resolution in um/px written into the slides.")
@click.option("--style", "styles", multiple=True, type=click.Choice(["a", "b"]),
              help="Tissue class(es): a = dense small dark nuclei, pink; b = sparse large pale nuclei, "
                   "lilac. Repeat to alternate. [default: a]")
@click.option("--texture", default="procedural", show_default=True,
              type=click.Choice(["procedural", "real", "auto"]),
              help="Tissue pixels: procedural, real H&E from ../shared/data/slides, or real when present.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, MAX_SEED - MAX_SLIDES),
              help="Seed of slide 0 (+1 per slide).")
@click.option("--prefix", default="sample", show_default=True, help="File names are PREFIX-NNN.svs.")
@click.option("--tile-px", default=256, show_default=True, type=click.IntRange(16, 4096),
              help="TIFF tile size in pixels (a multiple of 16).")
@click.option("--no-mpp", "no_mpp", is_flag=True, help="Write no resolution metadata (to test --mpp).")
@user_errors
def command(
    out_dir: Path, n: int, size_um: float, mpp: float, styles: tuple[str, ...], texture: str, seed: int,
    prefix: str, tile_px: int, no_mpp: bool,
) -> None:
    """Write generated pyramidal, JPEG-compressed Aperio-style TIFF slides with tissue, blank
    background and a blurred region at known places (listed in OUT/slides.json, in micrometres)."""
    from wsi.errors import ConfigError
    from wsi.synthetic import Style, Texture, write_sample_cohort

    if tile_px % 16:
        raise ConfigError(f"--tile-px {tile_px} must be a multiple of 16 (a TIFF rule)")
    try:
        slides = write_sample_cohort(
            out_dir, n=n, size_um=size_um, mpp=mpp, styles=cast("tuple[Style, ...]", styles or ("a",)),
            texture=cast(Texture, texture),
            seed=seed, prefix=prefix, tile_px=tile_px, write_mpp=not no_mpp, progress=n > 1,
        )
    except FileNotFoundError as exc:  # --texture real without the source slide
        raise ConfigError(f"--texture real: {exc}") from None
    s = slides[0]
    click.echo(
        f"wrote {len(slides)} slide(s) of {s.width_px}x{s.height_px} px at {mpp} um/px "
        f"({s.texture} texture) to {out_dir}; scenes in {out_dir / 'slides.json'}"
    )

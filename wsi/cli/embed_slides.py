"""`wsi embed-slides`: slide- or patient-level embeddings from bags of tile features."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from wsi.cli._common import EXIT_PARTIAL_FAILURE, ensure_writable_dir, user_errors
from wsi.cli._locations import PathOrUrl
from wsi.cli._options import config_options
from wsi.pipelines.embed_slides.config import SlideEmbedOptions
from wsi.storage import Url

# option -> SlideEmbedOptions field: defaults, choices and help come from the fields
# (pipelines/embed_slides/config.py)
EMBED_SLIDES_FLAGS = {
    "--encoder": "encoder", "--weights": "weights", "--random-init": "random_init", "--level": "level",
    "--slide-table": "slide_table", "--device": "device", "--overwrite": "overwrite",
}  # fmt: skip


@click.command(
    "embed-slides",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  wsi embed-slides --features run/features/conch-v1.5 --encoder feather --weights /models/feather/ --out run/
  wsi embed-slides --features run/features/ctranspath --encoder chief \\
      --weights CHIEF_pretraining.pth --out run/
  wsi embed-slides --features bags/ --encoder chief --weights CHIEF_pretraining.pth --out run/ \\
      --level patient --slide-table slides.csv          # slides.csv: columns patient, slide
  wsi embed-slides --features bags/ --encoder feather --random-init --out test/   # tests only
  wsi train --task nsclc-subtype --features run/feather-slide --labels labels.csv --out model/

\b
Output: OUT/<encoder>-slide/<slide_id>.h5 (--level patient: OUT/<encoder>-pat/<patient_id>.h5), each
`feats` (D,) float32 with STAMP's attributes (encoder, feat_type, precision) so STAMP's slide-level
training reads the folder, plus provenance (slide and tile encoder, both weights sha256, tile size and
um/px, source bags); manifest.csv lists every slide's status. Each bag is checked first: features of
another tile encoder (or weights), tile size or resolution are refused, naming both. `wsi encoders
--slide` lists the slide encoders, the tile encoder each needs, and where their weights come from.
""",
)
@click.option(
    "--features", required=True, type=PathOrUrl(exists=True),
    help="Folder of tile-feature bags (wsi embed, STAMP), or one bag; or a folder's URL.",
)  # fmt: skip
@click.option(
    "--out", "out_dir", required=True, type=PathOrUrl(file_okay=False), help="Output folder (or URL)."
)
@config_options(SlideEmbedOptions, EMBED_SLIDES_FLAGS, into="settings")
@user_errors
def command(features: Path | Url, out_dir: Path | Url, settings: dict[str, Any]) -> None:
    """Embed each slide (or patient) with a slide-level foundation encoder."""
    from wsi.core.config import parse_config

    options = parse_config(SlideEmbedOptions, settings, source="wsi embed-slides options")
    ensure_writable_dir(out_dir)
    from wsi.pipelines.embed_slides import embed_slides
    from wsi.storage import origin

    result = embed_slides(features, out_dir=out_dir, options=options)
    summary = result.summary
    line = summary.line("embed-slides", unit="tiles", noun=f"{options.level}s")
    click.echo(f"wsi {line} -> {origin(result.folder)}", err=True)
    for r in summary.problems[:10]:
        click.echo(f"  {r.slide_id}: {r.error}", err=True)
    if summary.problems:
        raise SystemExit(EXIT_PARTIAL_FAILURE)

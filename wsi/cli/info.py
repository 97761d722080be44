"""`wsi info`: summarise a slide, a tile file or a feature bag (ours, STAMP, CLAM, TRIDENT)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from wsi.cli._common import user_errors
from wsi.cli._options import FiniteFloatRange, config_options
from wsi.config import MAX_MPP
from wsi.pipelines.tile.config import TileOptions


@click.command(
    "info",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  wsi info slides/slide1.svs                      # vendor, levels, size, mpp and its source, objective
  wsi info run/tiles/slide1.h5
  wsi info run/features/retccl/slide1.h5
  wsi info clam_features/slide1.h5 --mpp 0.25     # CLAM/TRIDENT coords are level-0 pixels
  wsi info run/features/retccl/*.h5 --json
Exit status 1 when a bag is one wsi train and predict refuse (its `usable` line says why).
""",
)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--mpp",
    type=FiniteFloatRange(min=0, max=MAX_MPP, min_open=True),
    default=None,
    help="Level-0 um/px: for CLAM/TRIDENT bags (their coordinates are in pixels), or a slide without one.",
)
@config_options(TileOptions, {"--backend": "backend"}, into="reading")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per file instead of text.")
@user_errors
def command(files: tuple[Path, ...], mpp: float | None, reading: dict[str, str], as_json: bool) -> None:
    """Print a summary of slides, tile files and feature bags: sizes, resolution, provenance, extent."""
    import h5py

    from wsi.bags import bag_info
    from wsi.errors import BagFormatError
    from wsi.slide_info import slide_info
    from wsi.tile_file import is_tile_file, tile_file_info

    refused = 0
    for i, path in enumerate(files):
        if not path.is_file():
            raise BagFormatError(f"{path}: file not found")
        if not h5py.is_hdf5(path):  # not a tile file or a bag: a slide, or a SlideError naming it
            summary = slide_info(path, backend=reading["backend"], mpp=mpp)
        else:
            summary = tile_file_info(path) if is_tile_file(path) else bag_info(path, mpp=mpp)
        refused += "usable" in summary  # a bag train and predict refuse (why: its `usable`)
        if as_json:
            click.echo(json.dumps(summary, default=str))
            continue
        if i:
            click.echo("")
        width = max(len(k) for k in summary)
        for key, value in summary.items():
            click.echo(f"{key:<{width}}  {value}")
    if refused:  # not exit 0 for a bag that the next command refuses
        click.echo(f"{refused} of {len(files)} bag(s) would be refused by wsi train and predict", err=True)
        raise SystemExit(1)

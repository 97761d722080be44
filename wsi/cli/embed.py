"""`wsi embed`: embed tiles with one or several encoders into per-slide HDF5 feature bags."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from wsi.cli._common import EXIT_PARTIAL_FAILURE, EXIT_USAGE, ensure_writable_dir, user_errors
from wsi.cli._locations import PathOrUrl
from wsi.cli._options import config_options, field_of, model_default
from wsi.pipelines.embed.config import EmbedOptions
from wsi.pipelines.tile.config import TileOptions
from wsi.storage import Url
from wsi.tiling.params import TileParams

# option -> EmbedOptions field: defaults, ranges and help come from the fields (pipelines/embed/config.py)
EMBED_FLAGS = {
    "--random-init": "random_init", "--input-px": "input_px", "--device": "device",
    "--precision": "precision", "--compile": "compile", "--threads": "threads",
    "--batch-size": "batch_size", "--stain-norm": "stain_norm", "--stain-reference": "stain_reference",
    "--readers": "readers", "--reader-mode": "reader_mode", "--decode": "decode", "--dtype": "dtype",
    "--max-bad-tiles": "max_bad_tiles", "--cache": "use_cache", "--overwrite": "overwrite", "--gpus": "gpus",
}  # fmt: skip


@click.command(
    "embed",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  wsi embed --tiles run/ --out run/ --weights best_ckpt.pth          # RetCCL on tiled slides
  wsi embed slides/ --out run/ --weights best_ckpt.pth               # tile first, then embed
  wsi embed --tiles run/ --out run/ --encoder timm:resnet50 --weights resnet50.safetensors
  wsi embed --tiles run/ --out run/ --random-init                    # tests / demo only
  wsi embed --tiles run/ --out run/ --weights best_ckpt.pth --scheduler tcp://10.0.0.5:8786
  wsi embed --tiles run/ --out run/ --weights best_ckpt.pth --decode cpu --readers 15   # openslide decoding
  wsi embed --tiles run/ --out run/ --encoder uni --weights /models/UNI/         # a hub model folder
  # several encoders in one pass: each tile is read and decoded once, one bag folder per encoder;
  # the i-th --weights (and --sha256) belongs to the i-th --encoder
  wsi embed --tiles run/ --out run/ --encoder uni2-h --weights /models/UNI2-h/
            --encoder virchow2 --weights /models/Virchow2/pytorch_model.bin
  wsi embed --tiles run/ --out run/ --weights best_ckpt.pth --stain-norm macenko  # shipped H&E reference
  wsi embed --tiles run/ --out run/ --weights best_ckpt.pth --stain-norm reinhard --stain-reference ref.png
  wsi embed --tiles run/ --out run/ --encoder uni --weights /models/UNI/ --gpus all --batch-size auto
  wsi embed --tiles s3://lab/run/ --out s3://lab/run/ --encoder uni2-h   # weights from the HF cache

\b
Output (under --out):
  features/<encoder_id>/<slide_id>.h5   feats (N,D), coords (N,2) um top-left, coords_px (N,2)
                                        level-0 px, soft link features -> feats; provenance attrs
  features/<encoder_id>/manifest.csv    one row per slide: slide, path, status, tiles, seconds, error

\b
Tiles come from the --save-tiles cache (tiles/<slide_id>.zarr) when complete, else from the slide.
Exit code: 0 all slides done (or skipped), 1 some slides failed or kept no tile (status empty; see the
manifest), 2 usage error (including an --out that cannot be written). Re-running skips bags made by the
same encoder (name, weights, recipe, input size), stain normalisation, tiles and dtype; --overwrite
redoes them. Adding an --encoder to a finished run computes only the new encoder's bags. A bag of the
same slide id made from another slide file is never replaced without --overwrite (the slide fails,
naming both files); nor are ids differing only by case. Unreadable tiles are left out of a bag and
counted (summary, bag attribute n_bad_tiles).

\b
Several GPUs: --gpus N (or all) runs one worker per GPU on this machine. On a dask cluster
(--scheduler), start one worker per GPU, each pinned to its GPU:
  CUDA_VISIBLE_DEVICES=0 dask worker tcp://host:8786 --nworkers 1 --nthreads 1
  CUDA_VISIBLE_DEVICES=1 dask worker tcp://host:8786 --nworkers 1 --nthreads 1
""",
)
@click.argument("paths", nargs=-1, type=PathOrUrl())
@click.option(
    "--tiles",
    "tiles_dir",
    type=PathOrUrl(file_okay=False),
    default=None,
    help="Output folder of `wsi tile` (or its tiles/ folder), or its URL. Not needed with slide PATHS.",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=PathOrUrl(file_okay=False),
    help="Output folder (or URL: each bag is uploaded when written); bags go to OUT/features/<encoder_id>/.",
)
@click.option(
    "--encoder", "encoders", multiple=True, default=(model_default(EmbedOptions, "encoder"),),
    show_default=True, help=field_of(EmbedOptions, "encoder")[0].metadata["description"],
)  # fmt: skip
@click.option(
    "--weights", "weights", multiple=True, type=PathOrUrl(),
    help=field_of(EmbedOptions, "weights")[0].metadata["description"],
)  # fmt: skip
@click.option(
    "--sha256", "expected_sha256", multiple=True,
    help=field_of(EmbedOptions, "expected_sha256")[0].metadata["description"],
)  # fmt: skip
@config_options(EmbedOptions, EMBED_FLAGS, into="settings")
@config_options(EmbedOptions, {"--workers": "workers", "--scheduler": "scheduler"}, into="run")
@config_options(TileParams, {"--tile-um": "tile_um", "--tile-px": "tile_px"}, into="tiling")
@config_options(TileOptions, {"--mpp": "mpp"}, into="slide_run")
@user_errors
def command(
    paths: tuple[Path | Url, ...],
    tiles_dir: Path | Url | None,
    out_dir: Path | Url,
    encoders: tuple[str, ...],
    weights: tuple[Path, ...],
    expected_sha256: tuple[str, ...],
    settings: dict[str, Any],
    run: dict[str, Any],
    tiling: dict[str, Any],
    slide_run: dict[str, Any],
) -> None:
    """Embed tiles with one or several encoders into one HDF5 feature bag per slide and encoder.

    Give either --tiles (the output of `wsi tile`) or slide PATHS (files, folders, CSV lists), which
    are tiled first into --out. A slide with unreadable tiles is embedded without them unless more than
    --max-bad-tiles fail; a failing slide is recorded in the manifest and never stops the others.
    """
    from wsi.core.config import parse_config
    from wsi.pipelines.embed import embed_tiles, tile_and_embed

    if bool(paths) == (tiles_dir is not None):
        click.echo("Error: give either --tiles DIR or slide PATHS (not both, not neither)", err=True)
        raise SystemExit(EXIT_USAGE)
    ensure_writable_dir(out_dir)  # before any work: a read-only --out is a usage error (exit 2)
    input_px = settings.pop("input_px", None)  # per encoder when there are several
    given: dict[str, Any] = {
        **settings, **run, **_encoder_fields(encoders, weights, expected_sha256, input_px)
    }
    options = parse_config(EmbedOptions, given, source="wsi embed options")
    if tiles_dir is not None:
        results = embed_tiles(tiles_dir, out_dir=out_dir, options=options)
    else:
        from wsi.slides.sources import find_slides

        sources = find_slides(paths)
        if not sources:
            click.echo(f"Error: no slide files found in {', '.join(map(str, paths))}", err=True)
            raise SystemExit(EXIT_USAGE)
        params = parse_config(TileParams, tiling, source="wsi embed options")
        tile_options = parse_config(TileOptions, slide_run, source="wsi embed options")  # --mpp
        results = tile_and_embed(sources, out_dir=out_dir, options=options, tile_params=params,
                                 tile_options=tile_options)  # fmt: skip
    if _report(results, out_dir, [c.name for c in options.choices()]):
        raise SystemExit(EXIT_PARTIAL_FAILURE)


def _encoder_fields(
    encoders: tuple[str, ...], weights: tuple[Path, ...], sha256: tuple[str, ...], input_px: int | None
) -> dict[str, Any]:
    """EmbedOptions fields: one encoder as always; several paired with --weights / --sha256 by order."""
    from wsi.core.errors import ConfigError

    n = len(encoders)
    for option, values in (("--weights", weights), ("--sha256", sha256)):
        if len(values) not in (0, n) or (n == 1 and len(values) > 1):
            raise ConfigError(
                f"{len(values)} {option} for {n} --encoder: give one {option} per --encoder, in the same "
                f"order (the i-th {option} belongs to the i-th --encoder)"
            )
    if n == 1:
        return {"encoder": encoders[0], "weights": str(weights[0]) if weights else None,
                "expected_sha256": sha256[0] if sha256 else None, "input_px": input_px}  # fmt: skip
    choices = []
    for i, name in enumerate(encoders):
        choices.append({"name": name, "weights": str(weights[i]) if weights else None,
                        "expected_sha256": sha256[i] if sha256 else None, "input_px": input_px})  # fmt: skip
    return {"encoders": choices}


def _report(results: Sequence[Any], out_dir: Path | Url, names: list[str]) -> bool:
    """The summary per encoder on stderr; True when some slide failed or kept no tile (exit 1)."""
    from wsi.models.encoders import encoder_id_for
    from wsi.pipelines.embed import bad_tile_report, results_by_encoder
    from wsi.pipelines.scheduling.results import RunSummary
    from wsi.storage import local_view

    by_encoder = results_by_encoder(results)
    problems = False
    for name in names:
        encoder_id = encoder_id_for(name)
        rows = by_encoder.get(encoder_id, [])
        summary = RunSummary.of(rows)
        stage = "embed" if len(names) == 1 else f"embed {encoder_id}"
        folder = out_dir / "features" / encoder_id  # what `wsi train --features` takes next
        click.echo(f"wsi {summary.line(stage, unit='tiles')} -> {folder}", err=True)
        ok = [r for r in rows if r.status == "ok"]
        for line in bad_tile_report(ok, out_dir=local_view(out_dir), encoder=name):
            click.echo(f"  {line}", err=True)
        for r in summary.problems[:10]:  # failed, then empty ("tiling kept no tile: ...")
            click.echo(f"  {r.slide_id}: {r.error}", err=True)
        problems = problems or bool(summary.problems)
    return problems

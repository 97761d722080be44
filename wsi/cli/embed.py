"""`wsi embed`: embed tiles with an encoder into per-slide HDF5 feature bags."""

from __future__ import annotations

from pathlib import Path

import click

from wsi.cli._common import (
    EXIT_PARTIAL_FAILURE,
    EXIT_USAGE,
    ensure_writable_dir,
    mpp_option,
    scheduler_option,
    tile_size_options,
    user_errors,
    workers_option,
)


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

\b
Output (under --out):
  features/<encoder_id>/<slide_id>.h5   feats (N,D), coords (N,2) um top-left, coords_px (N,2)
                                        level-0 px, soft link features -> feats; provenance attrs
  features/<encoder_id>/manifest.csv    one row per slide: slide, path, status, tiles, seconds, error

\b
Tiles come from the --save-tiles cache (tiles/<slide_id>.zarr) when complete, else from the slide.
Exit code: 0 all slides done (or skipped), 1 some slides failed (see the manifest), 2 usage error
(including an --out that cannot be written). Re-running skips bags made by the same encoder and
weights; --overwrite redoes them. A bag of the same slide id made from another slide file is never
replaced without --overwrite (the slide fails, naming both files); nor are ids differing only by case.
Unreadable tiles are left out of a bag and counted (summary, bag attribute n_bad_tiles).
""",
)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--tiles",
    "tiles_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Output folder of `wsi tile` (or its tiles/ folder). Not needed with slide PATHS.",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Output folder; bags go to OUT/features/<encoder_id>/.",
)
@click.option(
    "--encoder",
    default="retccl",
    show_default=True,
    help="Encoder name: retccl, or timm:<architecture> (any timm model).",
)
@click.option(
    "--weights",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Weights file (.pth/.pt/.bin state dict, or .safetensors).",
)
@click.option("--random-init", is_flag=True, help="No weights: random features, for tests and demos only.")
@click.option(
    "--input-px",
    type=click.IntRange(min=16),
    default=None,
    help="Network input side for timm encoders [default: the architecture's]; retccl is 256.",
)
@click.option("--sha256", "expected_sha256", default=None, help="Refuse weights whose sha256 differs.")
@click.option("--device", default=None, help="cuda, cuda:1 or cpu [default: cuda when available].")
@click.option(
    "--precision",
    type=click.Choice(["bf16", "fp16", "fp32"]),
    default="bf16",
    show_default=True,
    help="Autocast precision on CUDA (the CPU always runs fp32).",
)
@click.option("--compile", "compile_", is_flag=True, help="torch.compile the encoder (CUDA, long runs).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads for the encoder.")
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=128, show_default=True, help="Tiles per pass."
)
@click.option(
    "--readers",
    type=click.IntRange(min=0),
    default=None,
    help="Background readers [default: cores - 1, 1 to 16]; 0 reads inline.",
)
@click.option(
    "--reader-mode",
    type=click.Choice(["process", "thread"]),
    default="process",
    show_default=True,
    help="Readers as processes (fastest) or threads (when /dev/shm is small).",
)
@click.option(
    "--decode",
    type=click.Choice(["auto", "device", "cpu"]),
    default="auto",
    show_default=True,
    help="Where JPEG tiles are decoded and resized: device (nvjpeg on CUDA; readers only slice the "
    "compressed tiles out of the file), cpu (openslide/tiffslide in the readers), auto (device on CUDA).",
)
@click.option(
    "--dtype",
    type=click.Choice(["float16", "float32"]),
    default="float16",
    show_default=True,
    help="Storage type of the features.",
)
@click.option(
    "--max-bad-tiles",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.05,
    show_default=True,
    help="Fail a slide when more than this fraction of its tiles cannot be read.",
)
@click.option("--no-cache", is_flag=True, help="Read tiles from the slides even when a zarr cache exists.")
@click.option("--overwrite", is_flag=True, help="Redo bags that are already complete.")
@workers_option("Local dask worker processes, each with its own encoder (e.g. one per GPU).")
@scheduler_option()
@tile_size_options("With slide PATHS: ")
@mpp_option("With slide PATHS: level-0 um/px for slides whose metadata has none.")
@user_errors
def command(
    paths: tuple[Path, ...],
    tiles_dir: Path | None,
    out_dir: Path,
    encoder: str,
    weights: Path | None,
    random_init: bool,
    input_px: int | None,
    expected_sha256: str | None,
    device: str | None,
    precision: str,
    compile_: bool,
    threads: int | None,
    batch_size: int,
    readers: int | None,
    reader_mode: str,
    decode: str,
    dtype: str,
    max_bad_tiles: float,
    no_cache: bool,
    overwrite: bool,
    workers: int,
    scheduler: str | None,
    tile_um: float,
    tile_px: int,
    mpp: float | None,
) -> None:
    """Embed tiles with an encoder into one HDF5 feature bag per slide.

    Give either --tiles (the output of `wsi tile`) or slide PATHS (files, folders, CSV lists), which
    are tiled first into --out. A slide with unreadable tiles is embedded without them unless more than
    --max-bad-tiles fail; a failing slide is recorded in the manifest and never stops the others.
    """
    from pipelines.embed import EmbedOptions, bad_tile_report, embed_slides, embed_tiles
    from pipelines.embed.options import default_readers
    from wsi.config import parse_config

    if bool(paths) == (tiles_dir is not None):
        click.echo("Error: give either --tiles DIR or slide PATHS (not both, not neither)", err=True)
        raise SystemExit(EXIT_USAGE)
    ensure_writable_dir(out_dir)  # before any work: a read-only --out is a usage error (exit 2)
    given = {
        "encoder": encoder, "weights": str(weights) if weights else None, "random_init": random_init,
        "expected_sha256": expected_sha256, "input_px": input_px, "device": device, "precision": precision,
        "compile": compile_, "threads": threads, "batch_size": batch_size,
        "readers": default_readers() if readers is None else readers, "reader_mode": reader_mode,
        "decode": decode, "dtype": dtype, "max_bad_tiles": max_bad_tiles, "use_cache": not no_cache,
        "overwrite": overwrite,
    }  # fmt: skip
    options = parse_config(EmbedOptions, given, source="wsi embed options")
    if tiles_dir is not None:
        results = embed_tiles(
            tiles_dir=tiles_dir, out_dir=out_dir, options=options, workers=workers, scheduler=scheduler
        )
    else:
        from wsi.sources import find_slides
        from wsi.tiling import TileParams

        sources = find_slides(paths)
        if not sources:
            click.echo(f"Error: no slide files found in {', '.join(map(str, paths))}", err=True)
            raise SystemExit(EXIT_USAGE)
        try:
            params = TileParams(tile_um=tile_um, tile_px=tile_px)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
        results = embed_slides(
            sources, out_dir=out_dir, options=options, tile_params=params, mpp=mpp, workers=workers,
            scheduler=scheduler,
        )  # fmt: skip
    from pipelines.jobs import RunSummary

    summary = RunSummary.of(results)
    click.echo(f"wsi {summary.line('embed', unit='tiles')} -> {out_dir / 'features'}", err=True)
    for line in bad_tile_report([r for r in results if r.status == "ok"], out_dir=out_dir, encoder=encoder):
        click.echo(f"  {line}", err=True)
    for r in summary.failed[:10]:
        click.echo(f"  {r.slide_id}: {r.error}", err=True)
    if summary.failed:
        raise SystemExit(EXIT_PARTIAL_FAILURE)

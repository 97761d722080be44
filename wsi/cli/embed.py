"""`wsi embed`: embed tiles with one or several encoders into per-slide HDF5 feature bags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
  wsi embed --tiles run/ --out run/ --encoder uni --weights /models/UNI/         # a hub model folder
  # several encoders in one pass: each tile is read and decoded once, one bag folder per encoder;
  # the i-th --weights (and --sha256) belongs to the i-th --encoder
  wsi embed --tiles run/ --out run/ --encoder uni2-h --weights /models/UNI2-h/
            --encoder virchow2 --weights /models/Virchow2/pytorch_model.bin
  wsi embed --tiles run/ --out run/ --weights best_ckpt.pth --stain-norm macenko  # shipped H&E reference
  wsi embed --tiles run/ --out run/ --weights best_ckpt.pth --stain-norm reinhard --stain-reference ref.png
  wsi embed --tiles run/ --out run/ --encoder uni --weights /models/UNI/ --gpus all --batch-size auto

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
    "encoders",
    multiple=True,
    default=("retccl",),
    show_default=True,
    help="Encoder: a name from `wsi encoders` (retccl, uni, uni2-h, virchow2, ...), timm:<architecture>, "
    "or a recipe file my-encoder.yaml. Repeat it to run several encoders on one read of the tiles.",
)
@click.option(
    "--weights",
    "weights",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Weights file (.pth/.pt/.bin state dict, or .safetensors) or the model folder as the authors' hub "
    "repository lays it out (config.json + weights). With several --encoder: one --weights each, in the "
    "same order.",
)
@click.option("--random-init", is_flag=True, help="No weights: random features, for tests and demos only.")
@click.option(
    "--input-px",
    type=click.IntRange(min=16),
    default=None,
    help="Network input side for timm:<name> encoders [default: the architecture's]; named encoders fix "
    "theirs (retccl 256, uni 224, ...).",
)
@click.option(
    "--sha256",
    "expected_sha256",
    multiple=True,
    help="Refuse weights whose sha256 differs. With several --encoder: none, or one each in order.",
)
@click.option("--device", default=None, help="cuda, cuda:1 or cpu [default: cuda when available].")
@click.option(
    "--precision",
    type=click.Choice(["bf16", "fp16", "fp32"]),
    default="bf16",
    show_default=True,
    help="Autocast precision on CUDA (the CPU always runs fp32).",
)
@click.option("--compile", "compile_", is_flag=True, help="torch.compile the encoders (CUDA, long runs).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads for the encoder.")
@click.option(
    "--batch-size",
    default="128",
    show_default=True,
    metavar="N|auto",
    help="Tiles per pass; auto: measured from free GPU memory on CUDA (every encoder probed, at most "
    "256), 128 on the CPU.",
)
@click.option(
    "--stain-norm",
    type=click.Choice(["macenko", "reinhard"]),
    default=None,
    help="Stain-normalise tiles on the device before the encoders (recorded in every bag). "
    "[default: none]",
)
@click.option(
    "--stain-reference",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="What --stain-norm maps onto: a saved reference (.json), an image or a folder of images, or a "
    "tile file (tiles/<slide_id>.h5) to fit it from [default: the method's shipped H&E reference].",
)
@click.option(
    "--gpus",
    default=None,
    metavar="N|all",
    help="One worker per GPU on this machine (N GPUs, or all); exit 2 when there are not that many.",
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
@workers_option("Local dask worker processes, each with its own encoders (GPUs: use --gpus).")
@scheduler_option()
@tile_size_options("With slide PATHS: ")
@mpp_option("With slide PATHS: level-0 um/px for slides whose metadata has none.")
@user_errors
def command(
    paths: tuple[Path, ...],
    tiles_dir: Path | None,
    out_dir: Path,
    encoders: tuple[str, ...],
    weights: tuple[Path, ...],
    random_init: bool,
    input_px: int | None,
    expected_sha256: tuple[str, ...],
    device: str | None,
    precision: str,
    compile_: bool,
    threads: int | None,
    batch_size: str,
    stain_norm: str | None,
    stain_reference: Path | None,
    gpus: str | None,
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
    """Embed tiles with one or several encoders into one HDF5 feature bag per slide and encoder.

    Give either --tiles (the output of `wsi tile`) or slide PATHS (files, folders, CSV lists), which
    are tiled first into --out. A slide with unreadable tiles is embedded without them unless more than
    --max-bad-tiles fail; a failing slide is recorded in the manifest and never stops the others.
    """
    from wsi.config import parse_config
    from wsi.pipelines.embed import EmbedOptions, embed_slides, embed_tiles
    from wsi.pipelines.embed.gpus import parse_gpus
    from wsi.pipelines.embed.options import default_readers

    if bool(paths) == (tiles_dir is not None):
        click.echo("Error: give either --tiles DIR or slide PATHS (not both, not neither)", err=True)
        raise SystemExit(EXIT_USAGE)
    ensure_writable_dir(out_dir)  # before any work: a read-only --out is a usage error (exit 2)
    given: dict[str, Any] = {
        **_encoder_fields(encoders, weights, expected_sha256, input_px), "random_init": random_init,
        "device": device, "precision": precision, "compile": compile_, "threads": threads,
        "batch_size": batch_size, "readers": default_readers() if readers is None else readers,
        "reader_mode": reader_mode, "decode": decode, "dtype": dtype, "max_bad_tiles": max_bad_tiles,
        "use_cache": not no_cache, "overwrite": overwrite, "stain_norm": stain_norm,
        "stain_reference": str(stain_reference) if stain_reference else None,
    }  # fmt: skip
    options = parse_config(EmbedOptions, given, source="wsi embed options")
    n_gpus = parse_gpus(gpus) if gpus is not None else None
    if tiles_dir is not None:
        results = embed_tiles(
            tiles_dir=tiles_dir, out_dir=out_dir, options=options, workers=workers, scheduler=scheduler,
            gpus=n_gpus,
        )  # fmt: skip
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
            scheduler=scheduler, gpus=n_gpus,
        )  # fmt: skip
    if _report(results, out_dir, [c.name for c in options.choices()]):
        raise SystemExit(EXIT_PARTIAL_FAILURE)


def _encoder_fields(
    encoders: tuple[str, ...], weights: tuple[Path, ...], sha256: tuple[str, ...], input_px: int | None
) -> dict[str, Any]:
    """EmbedOptions fields: one encoder as always; several paired with --weights / --sha256 by order."""
    from wsi.errors import ConfigError

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


def _report(results: list[Any], out_dir: Path, names: list[str]) -> bool:
    """The summary per encoder on stderr; True when some slide failed or kept no tile (exit 1)."""
    from wsi.models.encoders import encoder_id_for
    from wsi.pipelines.embed import bad_tile_report, results_by_encoder
    from wsi.pipelines.jobs import RunSummary

    by_encoder = results_by_encoder(results)
    problems = False
    for name in names:
        encoder_id = encoder_id_for(name)
        rows = by_encoder.get(encoder_id, [])
        summary = RunSummary.of(rows)
        stage = "embed" if len(names) == 1 else f"embed {encoder_id}"
        folder = out_dir / "features" / (encoder_id if len(names) > 1 else "")
        click.echo(f"wsi {summary.line(stage, unit='tiles')} -> {folder}", err=True)
        for line in bad_tile_report([r for r in rows if r.status == "ok"], out_dir=out_dir, encoder=name):
            click.echo(f"  {line}", err=True)
        for r in summary.problems[:10]:  # failed, then empty ("tiling kept no tile: ...")
            click.echo(f"  {r.slide_id}: {r.error}", err=True)
        problems = problems or bool(summary.problems)
    return problems

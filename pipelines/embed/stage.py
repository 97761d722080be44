"""The embed stage: tile files (or slides, tiled first) -> `features/<encoder_id>/<slide_id>.h5` bags.

Locally, all slides go through one stream (feed -> device -> writer thread), so reading never waits for
a slide boundary. With `workers > 1` or a `scheduler`, each slide is a dask job on a worker that holds
its own encoder (see worker.py). Either way a failing slide becomes a manifest row, never an abort.

Public API:
  embed_tiles(*, tiles_dir, out_dir, options=EmbedOptions(), slide_ids=None, workers=1, scheduler=None,
              progress=True) -> list[JobResult]
  embed_slides(sources, *, out_dir, options=EmbedOptions(), tile_params=None, backend="openslide",
               mpp=None, workers=1, scheduler=None, save_tiles=False, progress=True) -> list[JobResult]
  bag_dir(out_dir, encoder_id) -> Path        out_dir/features/<encoder_id>
  find_tile_files(tiles_dir) -> list[Path]    accepts the run folder or its tiles/ folder
  bad_tile_report(results, *, out_dir, encoder) -> list[str]   "slide: 3 of 120 tiles unreadable, ..."

A slide is refused (a failed row naming both files, logged as a warning) when its id differs only by
case from another's in the batch or in the bag folder, or when the bag of its id was made from another
slide file (unless --overwrite); see checks.py.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.encoders import Encoder, build_encoder, encoder_id_for
from pipelines.devices import resolve_device
from pipelines.embed.batches import slide_tiles_from_tile_file
from pipelines.embed.checks import bad_tile_lines, bad_tiles, other_slide, refuse_case_clashes
from pipelines.embed.engine import SlideJob, embed_stream, prepare_runtime
from pipelines.embed.options import EmbedOptions
from pipelines.jobs import JobResult, RunSummary, describe_error, run_jobs, write_manifest
from wsi.bags import BagProvenance, bag_length, is_complete_bag, read_bag_header, upgrade_bag
from wsi.errors import WsiError
from wsi.files import is_temp_name
from wsi.suffixes import BAG_SUFFIX, TILE_FILE_SUFFIX
from wsi.tilefile import read_tile_file

log = logging.getLogger(__name__)


def bag_dir(out_dir: str | os.PathLike[str], encoder_id: str) -> Path:
    return Path(out_dir) / "features" / encoder_id


def find_tile_files(tiles_dir: str | os.PathLike[str]) -> list[Path]:
    root = Path(tiles_dir)
    folder = root / "tiles" if (root / "tiles").is_dir() else root
    if not folder.is_dir():
        raise WsiError(f"--tiles {root}: folder not found; give the --out folder of `wsi tile`")
    files = sorted(p for p in folder.glob(f"*{TILE_FILE_SUFFIX}") if not is_temp_name(p))
    if not files:
        raise WsiError(f"--tiles {root}: no tile files (tiles/<slide_id>.h5); run `wsi tile` first")
    return files


def _jobs(files: Sequence[Path], out: Path, options: EmbedOptions) -> tuple[list[SlideJob], list[JobResult]]:
    """Tile files -> slide jobs; a tile file that cannot be read is a failed row."""
    jobs, failed = [], []
    for path in files:
        try:
            tf = read_tile_file(path)
        except WsiError as exc:
            failed.append(JobResult(path.stem, str(path), "failed", error=str(exc)))
            continue
        jobs.append(
            SlideJob(
                tiles=slide_tiles_from_tile_file(tf, use_cache=options.use_cache),
                bag_path=out / f"{tf.slide_id}{BAG_SUFFIX}",
                coords_um=tf.coords_um,
                tile_params=tf.params,
                level0_size=(int(tf.meta["level0_width"]), int(tf.meta["level0_height"])),
                tile_file=str(path),
            )
        )
    return jobs, failed


def embed_tiles(
    *,
    tiles_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: EmbedOptions = EmbedOptions(),
    slide_ids: Sequence[str] | None = None,
    workers: int = 1,
    scheduler: str | None = None,
    progress: bool = True,
) -> list[JobResult]:
    """Embed every tile file under `tiles_dir`; write bags and `features/<encoder_id>/manifest.csv`."""
    start = time.perf_counter()
    files = find_tile_files(tiles_dir)
    if slide_ids is not None:
        wanted = set(slide_ids)
        files = [f for f in files if f.stem in wanted]
    # Build (and so validate) the encoder before any work: bad weights are a usage error, not N failures.
    encoder = build_encoder(
        options.encoder, weights=options.weights, random_init=options.random_init,
        expected_sha256=options.expected_sha256, input_px=options.input_px,
    )  # fmt: skip
    out = bag_dir(out_dir, encoder.encoder_id)
    refused = refuse_case_clashes(files, out)
    results = [_refused(f.stem, str(f), why) for f, why in refused.items()]
    jobs, failed = _jobs([f for f in files if f not in refused], out, options)
    results += failed
    todo = []
    for job in jobs:
        clash = other_slide(job, overwrite=options.overwrite)
        if clash:  # another slide's bag under this id: never silently replaced, nor skipped as done
            results.append(_refused(job.tiles.slide_id, job.tiles.slide_path, clash))
            continue
        done = _is_current(job, encoder, options.dtype)
        if done and not options.overwrite:
            _upgrade(job.bag_path)
            results.append(JobResult(job.tiles.slide_id, job.tiles.slide_path, "skipped", n=_n(job)))
        else:
            if job.bag_path.exists() and not options.overwrite:
                log.warning("%s: redoing it (other weights or tiles, or unreadable)", job.bag_path)
            todo.append(job)
    if todo:
        if scheduler is None and workers == 1:
            rt = prepare_runtime(
                encoder, device=resolve_device(options.device), precision=options.precision,
                compile=options.compile, threads=options.threads, batch_size=options.batch_size,
            )  # fmt: skip
            results += embed_stream(
                rt,
                todo,
                options=options,
                readers=options.readers,
                mode=options.reader_mode,
                progress=progress,
            )
        else:
            del encoder  # each worker builds its own
            results += _embed_dask(todo, options, workers, scheduler)
    order = {f.stem: i for i, f in enumerate(files)}
    results.sort(key=lambda r: order.get(r.slide_id, len(order)))
    write_manifest(out / "manifest.csv", results)
    _summary(results, time.perf_counter() - start, out)
    return results


def _is_current(job: SlideJob, encoder: Encoder, dtype: str) -> bool:
    """A finished bag from this encoder, weights, input size and dtype, from the tile file as it is now."""
    if not is_complete_bag(job.bag_path, encoder=encoder.name, weights_sha256=encoder.weights_sha256):
        return False
    try:
        header = read_bag_header(job.bag_path)
        made = BagProvenance.from_dict(header.attrs, source=str(job.bag_path))
    except WsiError:  # unreadable, or not all of its provenance (ConfigError): redo it
        return False
    return (
        made.tile_params == job.tile_params
        and header.dtype == dtype
        and made.n_tiles_requested == job.tiles.n
        and made.input_px == encoder.input_px
    )


def _upgrade(bag: Path) -> None:
    """An older finished bag gains STAMP's feat_type, so that its folder stays one feature type."""
    try:
        if upgrade_bag(bag):
            log.info("%s: added feat_type='tile' (what STAMP needs) to the finished bag", bag)
    except OSError as exc:  # read-only, say: the bag is still fine for us
        log.warning("%s: could not add feat_type for STAMP (%s)", bag, exc)


def _n(job: SlideJob) -> int:
    try:
        return bag_length(job.bag_path)
    except WsiError:
        return 0


def _embed_dask(
    jobs: list[SlideJob], options: EmbedOptions, workers: int, scheduler: str | None
) -> list[JobResult]:
    from pipelines.embed.worker import EmbedItem, EncoderPlugin, embed_item

    items = [EmbedItem(job.tiles.slide_id, job.tiles.slide_path, job) for job in jobs]
    return run_jobs(
        items,
        functools.partial(embed_item, options=options),
        workers=workers,
        scheduler=scheduler,
        desc="embed",
        worker_plugin=EncoderPlugin(options),
    )


def _refused(slide_id: str, path: str, why: str) -> JobResult:
    log.warning("%s: refused: %s", slide_id, why)
    return JobResult(slide_id, path, "failed", error=why)


def _summary(results: list[JobResult], seconds: float, out: Path) -> None:
    log.info("%s; bags in %s", RunSummary.of(results, seconds).line("embed", unit="tiles"), out)
    for line in bad_tile_lines(bad_tiles([r for r in results if r.status == "ok"], out)):
        log.warning("%s", line)


def embed_slides(
    sources: Sequence[Any],
    *,
    out_dir: str | os.PathLike[str],
    options: EmbedOptions = EmbedOptions(),
    tile_params: Any = None,
    backend: str = "openslide",
    mpp: float | None = None,
    workers: int = 1,
    scheduler: str | None = None,
    save_tiles: bool = False,
    progress: bool = True,
) -> list[JobResult]:
    """Tile slides with the tile stage (into out_dir/tiles), then embed them; one row per slide.

    A slide the tile stage refused or failed (an unusable or clashing id, a broken file) is a failed
    row here too, with the tile stage's reason; `options.overwrite` redoes the tiles as well."""
    from pipelines.tile import tile_slides

    tiled = tile_slides(
        sources, out_dir=out_dir, params=tile_params, backend=backend, mpp=mpp, workers=workers,
        scheduler=scheduler, save_tiles=save_tiles, overwrite=options.overwrite,
    )  # fmt: skip
    ready = [r.slide_id for r in tiled if r.status in ("ok", "skipped")]
    failed = [
        JobResult(r.slide_id, r.path, "failed", seconds=r.seconds, error=f"tiling failed: {r.error}")
        for r in tiled
        if r.status == "failed"
    ]
    results: list[JobResult] = []
    if ready:
        results = embed_tiles(
            tiles_dir=out_dir, out_dir=out_dir, options=options, slide_ids=ready, workers=workers,
            scheduler=scheduler, progress=progress,
        )  # fmt: skip
    if failed:
        encoder_id = encoder_id_for(options.encoder)
        results = results + failed
        try:
            write_manifest(bag_dir(out_dir, encoder_id) / "manifest.csv", results)
        except OSError as exc:
            log.error("could not write the manifest: %s", describe_error(exc))
    return results


def bad_tile_report(
    results: Sequence[JobResult], *, out_dir: str | os.PathLike[str], encoder: str
) -> list[str]:
    """One line per finished slide whose bag left out unreadable tiles (for the command's summary)."""
    return bad_tile_lines(bad_tiles(results, bag_dir(out_dir, encoder_id_for(encoder))))

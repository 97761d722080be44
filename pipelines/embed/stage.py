"""The embed stage: tile files (or slides, tiled first) -> `features/<encoder_id>/<slide_id>.h5` bags.

`embed_tiles(tiles_dir, *, out_dir, options)` and `tile_and_embed(sources, *, out_dir, options)` return
an `EmbedResult`: one `BagResult` (a JobResult + its encoder_id) per slide and encoder. Each slide's
tiles are read and decoded once and fed to every encoder whose bag is missing or stale (plan.py), so
adding an encoder to a finished run computes only its bags. Locally all slides go through one stream
(feed -> device -> writer thread), so reading never waits at a slide boundary; with `workers > 1`,
`gpus` or a `scheduler`, each slide is a dask job on a worker that holds its own encoders (worker.py).
A failing or refused slide (checks.py) becomes a manifest row per encoder, never an abort; a slide whose
tiling kept no tile is an `empty` row, which makes the run exit 1.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from wsi.core.config import with_settings
from wsi.core.errors import ConfigError, WsiError
from wsi.core.files import is_temp_name
from wsi.core.suffixes import BAG_SUFFIX, TILE_FILE_SUFFIX
from wsi.models.encoders import Encoder, encoder_id_for
from wsi.models.encoders.stain import StainReference
from wsi.pipelines.embed.checks import bad_tile_lines, bad_tiles
from wsi.pipelines.embed.config import EmbedOptions
from wsi.pipelines.embed.engine import EmbedInterrupted, embed_works
from wsi.pipelines.embed.gpus import assign_gpus
from wsi.pipelines.embed.plan import Slide, bag_dir, plan, read_tile_files
from wsi.pipelines.embed.remote import embed_item_remote, local_tiles, publisher
from wsi.pipelines.embed.runtime import build_encoders, prepare_runtimes
from wsi.pipelines.embed.stain import resolve_stain_reference
from wsi.pipelines.embed.work import SlideWork, WorkResult
from wsi.pipelines.scheduling.devices import resolve_device
from wsi.pipelines.scheduling.jobs import JobsInterrupted, describe_error, run_jobs, write_manifest
from wsi.pipelines.scheduling.results import JobResult, RunSummary, StageResult
from wsi.storage import Mirror, origin, remote_output
from wsi.storage.folder_lock import output_lock

log = logging.getLogger(__name__)


@dataclass
class BagResult(JobResult):
    """A slide's row for one encoder: `encoder_id` names the bag folder (and manifest) it belongs to."""

    encoder_id: str = ""


R = TypeVar("R", bound=JobResult)
#: what the embed stage returns: one BagResult per slide and encoder
EmbedResult = StageResult[BagResult]


def results_by_encoder(results: Sequence[R]) -> dict[str, list[R]]:
    """Rows grouped by encoder_id, in the order the encoders first appear."""
    out: dict[str, list[R]] = {}
    for r in results:
        out.setdefault(getattr(r, "encoder_id", ""), []).append(r)
    return out


def find_tile_files(tiles_dir: str | os.PathLike[str]) -> list[Path]:
    root = Path(tiles_dir)
    folder = root / "tiles" if (root / "tiles").is_dir() else root
    if not folder.is_dir():
        raise WsiError(f"--tiles {root}: folder not found; give the --out folder of `wsi tile`")
    files = sorted(p for p in folder.glob(f"*{TILE_FILE_SUFFIX}") if not is_temp_name(p))
    if not files:
        raise WsiError(f"--tiles {root}: no tile files (tiles/<slide_id>.h5); run `wsi tile` first")
    return files


def check_gpus(options: EmbedOptions) -> list[Any]:
    """The devices of a `--gpus` run ([] without it); ConfigError for a combination that cannot work."""
    gpus, workers = options.gpus, options.workers
    if gpus is None:
        return []
    if options.scheduler is not None:
        raise ConfigError(
            "--gpus starts local workers; with --scheduler, start one dask worker per GPU yourself, each "
            "pinned with CUDA_VISIBLE_DEVICES=k (see `wsi embed --help`)"
        )
    if workers > 1:
        raise ConfigError("give --gpus N (one worker per GPU) or --workers N, not both")
    if options.device not in (None, "auto", "cuda"):
        raise ConfigError(f"--gpus picks the devices itself; drop --device {options.device}")
    import torch

    return assign_gpus(gpus, torch.cuda.device_count() if torch.cuda.is_available() else 0)


def _check_mpp(encoders: Sequence[Encoder], slides: Sequence[Slide]) -> None:
    """Warn (once per encoder and resolution) when tiles are >2x from an encoder's training mpp."""
    for mpp in sorted({round(job.tiles.target_mpp, 4) for _, job, _ in slides}):
        for enc in encoders:
            enc.check_mpp(mpp)


def embed_tiles(
    tiles_dir: str | os.PathLike[str],
    *,
    out_dir: str | os.PathLike[str],
    options: EmbedOptions | None = None,
    slide_ids: Sequence[str] | None = None,
    **settings: Any,
) -> EmbedResult:
    """Embed every tile file under `tiles_dir` (or those of `slide_ids`) with every encoder of `options`;
    write the bags and one `features/<encoder_id>/manifest.csv` per encoder. Rows come encoder by encoder,
    slides in file order. Either folder may be a URL (s3://...): the tile files are pulled, each bag
    uploaded once written. `settings`: EmbedOptions fields, applied over `options`."""
    opts = with_settings(EmbedOptions, options, settings, source="embed_tiles options")
    start = time.perf_counter()
    remote = remote_output(out_dir)
    out = remote.local if remote is not None else out_dir
    with output_lock(out):
        rows = _embed_tiles_locked(tiles_dir, out, opts, slide_ids, remote)
    where = str(remote.url) if remote is not None else Path(out)
    return EmbedResult("embed", where, tuple(rows), time.perf_counter() - start)


def _embed_tiles_locked(
    tiles_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: EmbedOptions,
    slide_ids: Sequence[str] | None,
    remote: Mirror | None = None,
) -> list[BagResult]:
    start = time.perf_counter()
    devices = check_gpus(options)
    tiles_local, tiles_url = local_tiles(tiles_dir)
    try:
        files = find_tile_files(tiles_local)
    except WsiError:
        if tiles_url is None:
            raise
        raise WsiError(f"--tiles {tiles_url}: no tile files (tiles/<slide_id>.h5); run `wsi tile`") from None
    if slide_ids is not None:
        wanted = set(slide_ids)
        files = [f for f in files if f.stem in wanted]
    # Build (and so validate) the encoders and the stain reference before any work: bad weights or a bad
    # reference file are usage errors, not N failed slides.
    encoders = build_encoders(options)
    stain = resolve_stain_reference(options.stain_norm, options.stain_reference)
    ids = [enc.encoder_id for enc in encoders]
    slides, unreadable = read_tile_files(files, options)
    if tiles_url is not None:  # bags record the tile file's URL, not this machine's copy of it
        slides = [(f, dataclasses.replace(job, tile_file=origin(f)), why) for f, job, why in slides]
    if remote is not None:  # the finished bags and manifests, for the plan's checks and resume
        for enc_id in dict.fromkeys(ids):
            remote.pull_folder(f"features/{enc_id}", suffixes=(BAG_SUFFIX, ".csv"))
    _check_mpp(encoders, slides)
    rows, works = plan(files, slides, encoders, options, stain, out_dir)
    for enc_rows in rows:
        enc_rows += unreadable  # a tile file that cannot be read fails for every encoder
    if works:
        try:
            done = _run(works, encoders, options, stain, devices, remote)
        except EmbedInterrupted as stop:  # Ctrl-C: the manifests record the bags that were finished
            _add(rows, stop.finished)
            _record(rows, ids, files, out_dir, remote, seconds=None)
            raise
        _add(rows, done)
    return _record(rows, ids, files, out_dir, remote, seconds=time.perf_counter() - start)


def _add(rows: list[list[JobResult]], done: list[list[JobResult | None]]) -> None:
    for work_rows in done:
        for k, row in enumerate(work_rows):
            if row is not None:
                rows[k].append(row)


def _record(
    rows: list[list[JobResult]], ids: list[str], files: Sequence[Path], out_dir: str | os.PathLike[str],
    remote: Mirror | None, *, seconds: float | None,
) -> list[BagResult]:  # fmt: skip
    """One manifest per encoder (and its summary line, unless interrupted); the rows, encoder by encoder."""
    order = {f.stem: i for i, f in enumerate(files)}
    results: list[BagResult] = []
    for encoder_id, enc_rows in zip(ids, rows, strict=True):
        enc_rows.sort(key=lambda r: order.get(r.slide_id, len(order)))
        tagged = [BagResult(**dataclasses.asdict(r), encoder_id=encoder_id) for r in enc_rows]
        out = bag_dir(out_dir, encoder_id)
        write_manifest(out / "manifest.csv", tagged)
        if seconds is not None:
            _summary(tagged, seconds, out, encoder_id if len(ids) > 1 else "")
        results += tagged
    if remote is not None:  # the manifests, and finished bags a failed upload or an upgrade left behind
        remote.push_all("features")
    return results


def _run(
    works: list[SlideWork],
    encoders: list[Encoder],
    options: EmbedOptions,
    stain: StainReference | None,
    devices: list[Any],
    remote: Mirror | None = None,
) -> list[list[JobResult | None]]:
    """Embed the works: one local stream, or one dask job per slide (workers, --gpus, a scheduler)."""
    if options.scheduler is None and options.workers == 1 and len(devices) <= 1:
        device = devices[0] if devices else resolve_device(options.device)
        tile_px = max(work.tiles.tile_px for work in works)
        runtimes, batch = prepare_runtimes(encoders, device=device, options=options, tile_px=tile_px)
        return embed_works(
            runtimes, works, options=options, readers=options.readers, mode=options.reader_mode,
            progress=options.progress, stain=stain, batch_size=batch, publish=publisher(remote),
        )  # fmt: skip
    encoders.clear()  # each worker builds its own: free the main process's copies
    names = [str(d) for d in devices]
    return _embed_dask(works, options, stain, names, max(options.workers, len(devices)), remote)


def _embed_dask(
    works: list[SlideWork],
    options: EmbedOptions,
    stain: StainReference | None,
    devices: list[str],
    workers: int,
    remote: Mirror | None = None,
) -> list[list[JobResult | None]]:
    from wsi.pipelines.embed.worker import EmbedItem, EncoderPlugin, embed_item

    items = [EmbedItem(w.tiles.slide_id, w.tiles.slide_path, w) for w in works]
    fn: Any = functools.partial(embed_item, options=options)
    if remote is not None:  # each worker writes into its own mirror and uploads what it made
        fn = functools.partial(
            embed_item_remote, options=options, remote=str(remote.url), client_root=str(remote.local)
        )
    try:
        results: Sequence[JobResult | None] = run_jobs(
            items,
            fn,
            workers=workers,
            scheduler=options.scheduler,
            desc="embed",
            progress=options.progress,
            worker_plugin=EncoderPlugin(options, stain=stain, devices=devices or None),
            unit="tiles",
        )
    except JobsInterrupted as stop:
        raise EmbedInterrupted(_bag_rows(works, stop.finished)) from None
    return _bag_rows(works, results)


def _bag_rows(works: list[SlideWork], results: Sequence[JobResult | None]) -> list[list[JobResult | None]]:
    """Per work, one row per encoder from a dask job's result (None: not finished)."""
    out: list[list[JobResult | None]] = []
    for work, r in zip(works, results, strict=True):
        if r is None:
            out.append([None] * len(work.jobs))
        elif isinstance(r, WorkResult):
            out.append(list(r.bags))
        else:  # the worker died, or the job raised: every bag of the slide failed with its reason
            out.append([None if job is None else JobResult(r.slide_id, r.path, "failed", seconds=r.seconds,
                                                           error=r.error) for job in work.jobs])  # fmt: skip
    return out


def _summary(results: list[BagResult], seconds: float, out: Path, label: str) -> None:
    stage = f"embed {label}" if label else "embed"
    log.info("%s; bags in %s", RunSummary.of(results, seconds).line(stage, unit="tiles"), out)
    for line in bad_tile_lines(bad_tiles([r for r in results if r.status == "ok"], out)):
        log.warning("%s", line)


def tile_and_embed(
    sources: Sequence[Any],
    *,
    out_dir: str | os.PathLike[str],
    options: EmbedOptions | None = None,
    tile_params: Any = None,
    tile_options: Any = None,
    **settings: Any,
) -> EmbedResult:
    """Tile slides with the tile stage (into out_dir/tiles), then embed them; one row per slide and encoder.

    `tile_params` (TileParams) say which tiles to keep, `tile_options` (TileOptions) how to read the
    slides (backend, mpp, save_tiles); the batch runs with the embed options' workers, scheduler and
    progress, and their `overwrite` redoes the tiles too. A slide the tile stage refused or failed (an
    unusable or clashing id, a broken file) is a failed row here too, with the tile stage's reason, and
    one whose tiling kept no tile an `empty` row ("tiling kept no tile: <why>")."""
    from wsi.pipelines.tile.config import TileOptions

    opts = with_settings(EmbedOptions, options, settings, source="tile_and_embed options")
    check_gpus(opts)  # before the tiling: a usage error costs nothing
    batch = {"workers": opts.workers, "scheduler": opts.scheduler, "progress": opts.progress}
    tiling = with_settings(
        TileOptions, tile_options, {**batch, "overwrite": opts.overwrite}, source="tile_and_embed options"
    )
    start = time.perf_counter()
    remote = remote_output(out_dir)
    with output_lock(remote.local if remote is not None else out_dir):  # across both stages (theirs nest)
        rows = _tile_and_embed_locked(sources, out_dir, opts, tile_params, tiling, remote)
    where = str(remote.url) if remote is not None else Path(out_dir)
    return EmbedResult("embed", where, tuple(rows), time.perf_counter() - start)


def _tile_and_embed_locked(
    sources: Sequence[Any],
    out_dir: str | os.PathLike[str],
    options: EmbedOptions,
    tile_params: Any,
    tile_options: Any,
    remote: Mirror | None = None,
) -> list[BagResult]:
    from wsi.pipelines.tile.stage import tile_slides

    tiled = tile_slides(sources, out_dir=out_dir, params=tile_params, options=tile_options)
    ready = [r.slide_id for r in tiled if r.status in ("ok", "skipped")]
    carried = [_carried(r) for r in tiled if r.status in ("failed", "empty")]
    results: list[BagResult] = []
    if ready:
        results = list(embed_tiles(out_dir, out_dir=out_dir, options=options, slide_ids=ready))
    if not carried:
        return results
    by_encoder = results_by_encoder(results)
    merged: list[BagResult] = []
    for choice in options.choices():
        encoder_id = encoder_id_for(choice.name)
        rows: list[BagResult] = [
            *by_encoder.get(encoder_id, []),
            *(BagResult(**dataclasses.asdict(r), encoder_id=encoder_id) for r in carried),
        ]
        try:
            manifest = bag_dir(remote.local if remote is not None else out_dir, encoder_id) / "manifest.csv"
            write_manifest(manifest, rows)
            if remote is not None:
                remote.push([remote.rel(manifest)])
        except OSError as exc:
            log.error("could not write the manifest: %s", describe_error(exc))
        merged += rows
    return merged


def _carried(r: JobResult) -> JobResult:
    """A slide the tile stage did not hand on, as the embed stage's row: failed, or empty with why."""
    if r.status == "empty":
        why = f"tiling kept no tile: {r.error}"
        return JobResult(r.slide_id, r.path, "empty", seconds=r.seconds, error=why)
    return JobResult(r.slide_id, r.path, "failed", seconds=r.seconds, error=f"tiling failed: {r.error}")


def bad_tile_report(
    results: Sequence[JobResult], *, out_dir: str | os.PathLike[str], encoder: str
) -> list[str]:
    """One line per finished slide whose bag left out unreadable tiles (for the command's summary)."""
    return bad_tile_lines(bad_tiles(results, bag_dir(out_dir, encoder_id_for(encoder))))

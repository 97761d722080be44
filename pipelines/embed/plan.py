"""What each slide needs from each encoder of a run, decided before any tile is read.

Per encoder and slide: an `empty` row (the tiling kept no tile), a refusal (`refused_row`: a case clash,
or the bag of this id belongs to another slide file; checks.py), `skipped` (its bag is current), or a
bag to make. The slides with bags to make become `SlideWork`s naming only the encoders that need them,
so a slide is read once for all of them and a finished bag is never recomputed for another encoder.
A bag is current when it is complete and made by this encoder (name, weights, recipe digest, input
size), with this stain normalisation (method, reference digest), dtype and tile file; else `stale` says
why. Bags live in `bag_dir(out_dir, encoder_id)` = out_dir/features/<encoder_id>.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from wsi.core.errors import WsiError
from wsi.core.suffixes import BAG_SUFFIX
from wsi.formats.bags import BagProvenance, bag_length, is_complete_bag, read_bag_header, upgrade_bag
from wsi.formats.bags.safe import coords_dataset, feature_dataset, open_bag_file
from wsi.formats.tile_file import coords_digest, read_tile_file
from wsi.models.encoders import Encoder
from wsi.models.encoders.stain import StainReference
from wsi.pipelines.embed.batches import slide_tiles_from_tile_file
from wsi.pipelines.embed.checks import other_encoder, other_slide, refuse_case_clashes
from wsi.pipelines.embed.config import EmbedOptions
from wsi.pipelines.embed.stain import stain_fields
from wsi.pipelines.embed.work import SlideJob, SlideWork
from wsi.pipelines.scheduling.results import JobResult
from wsi.storage.identity import HEADER_BYTES, SlideFingerprint, current_fingerprint

log = logging.getLogger(__name__)

Slide = tuple[Path, SlideJob, str]  # tile file, its slide job (bag path not set yet), why it kept no tile


def bag_dir(out_dir: str | os.PathLike[str], encoder_id: str) -> Path:
    """An encoder's bag folder: out_dir/features/<encoder_id>."""
    return Path(out_dir) / "features" / encoder_id


def read_tile_files(files: Sequence[Path], options: EmbedOptions) -> tuple[list[Slide], list[JobResult]]:
    """Tile files -> (file, slide job without its bag path, why it kept no tile); unreadable: failed rows."""
    slides, failed = [], []
    for path in files:
        try:
            tf = read_tile_file(path)
        except WsiError as exc:
            failed.append(JobResult(path.stem, str(path), "failed", error=str(exc)))
            continue
        job = SlideJob(
            tiles=slide_tiles_from_tile_file(tf, use_cache=options.use_cache),
            bag_path=Path(),
            coords_um=tf.coords_um,
            tile_params=tf.params,
            level0_size=(tf.meta.level0_width, tf.meta.level0_height),
            tile_file=str(path),
            fingerprint=tf.meta.fingerprint,
        )
        slides.append((path, job, tf.meta.empty_reason or "the tile file holds no tile"))
    return slides, failed


def plan(
    files: Sequence[Path],
    slides: Sequence[Slide],
    encoders: Sequence[Encoder],
    options: EmbedOptions,
    stain: StainReference | None,
    out_dir: str | os.PathLike[str],
) -> tuple[list[list[JobResult]], list[SlideWork]]:
    """Per encoder, the rows of slides that need no work; and the slides to read, each with the bags of
    the encoders that need it (a finished bag of one encoder is not recomputed for another)."""
    rows: list[list[JobResult]] = [[] for _ in encoders]
    needed: dict[Path, list[SlideJob | None]] = {}
    slides, changed = _as_they_are(slides)
    for k, enc in enumerate(encoders):
        out = bag_dir(out_dir, enc.encoder_id)
        refused = refuse_case_clashes(files, out)
        rows[k] += [refused_row(f.stem, str(f), why) for f, why in refused.items()]
        for path, base, empty_reason in slides:
            if path in refused:
                continue
            if path in changed and not options.overwrite:  # tiles of another file than the one there now
                job = dataclasses.replace(base, bag_path=out / f"{base.tiles.slide_id}{BAG_SUFFIX}")
                why = other_slide(job, overwrite=options.overwrite) or changed[path]  # a clash says more
                rows[k].append(refused_row(base.tiles.slide_id, base.tiles.slide_path, why))
                continue
            job = dataclasses.replace(base, bag_path=out / f"{base.tiles.slide_id}{BAG_SUFFIX}")
            row = _decide(job, enc, options, stain, empty_reason)
            if row is None:
                needed.setdefault(path, [None] * len(encoders))[k] = job
            else:
                rows[k].append(row)
    return rows, [SlideWork(tuple(jobs)) for jobs in needed.values()]


def _as_they_are(slides: Sequence[Slide]) -> tuple[list[Slide], dict[Path, str]]:
    """Each slide's job with the fingerprint of its file as it is now (a stat and its header: no full
    read); and the tile files whose slide file changed since they were made -> why."""
    out, changed = [], {}
    for path, job, empty_reason in slides:
        if job.tiles.n == 0:
            out.append((path, job, empty_reason))
            continue
        current = current_fingerprint(job.tiles.slide_path)
        # size and header: a copy or an upload of the same file has a version of its own (the tile stage,
        # which re-tiles a slide whose version changed at the same place, compares that too)
        known = job.fingerprint is not None and current is not None
        why = job.fingerprint.differs(current, moved=True) if known else ""  # type: ignore[union-attr,arg-type]
        if why:
            changed[path] = (
                f"the slide file {job.tiles.slide_path} changed since its tiles were made ({why}): its tiles "
                f"({path.name}) would be cut from another image. Run `wsi tile` again (it re-tiles a changed "
                "slide), then `wsi embed`"
            )
        out.append((path, dataclasses.replace(job, fingerprint=current or job.fingerprint), empty_reason))
    return out, changed


def _decide(
    job: SlideJob, enc: Encoder, options: EmbedOptions, stain: StainReference | None, empty_reason: str
) -> JobResult | None:
    """This encoder's row for a slide that needs no work (empty, refused, already done); None: embed it."""
    st = job.tiles
    if st.n == 0:
        return JobResult(st.slide_id, st.slide_path, "empty", error=f"tiling kept no tile: {empty_reason}")
    clash = other_slide(job, overwrite=options.overwrite) or other_encoder(
        job.bag_path, enc.name, enc.encoder_id, overwrite=options.overwrite
    )
    if clash:  # another slide's bag under this id: never silently replaced, nor skipped as done
        return refused_row(st.slide_id, st.slide_path, clash)
    why = stale(job, enc, options.dtype, stain)
    if why is None and not options.overwrite:
        _upgrade(job.bag_path)
        return JobResult(st.slide_id, st.slide_path, "skipped", n=_n(job))
    if why and not options.overwrite and job.bag_path.exists():
        log.warning("%s: redoing it (%s)", job.bag_path, why)
    return None


def stale(job: SlideJob, encoder: Encoder, dtype: str, stain: StainReference | None) -> str | None:
    """Why the bag must be made (again), or None when it is current: a finished bag from this encoder
    (name, weights, recipe, input size), this stain normalisation and dtype, from the tile file as it is."""
    if not job.bag_path.exists():
        return "no bag yet"
    if not is_complete_bag(job.bag_path, encoder=encoder.name, weights_sha256=encoder.weights_sha256):
        return "another encoder or weights, or unreadable"
    try:
        header = read_bag_header(job.bag_path)
        made = BagProvenance.from_dict(header.attrs, source=str(job.bag_path))
    except WsiError:  # unreadable, or not all of its provenance (ConfigError): redo it
        return "incomplete provenance"
    want = stain_fields(stain, None)
    if made.slide_size is not None and made.slide_version is not None and job.fingerprint is not None:
        recorded = SlideFingerprint(
            made.slide_size, made.slide_version, made.slide_header_sha256 or "",
            made.slide_header_bytes or HEADER_BYTES,
        )  # fmt: skip
        moved = made.slide_path != job.tiles.slide_path  # a moved file has a version of its own
        why = recorded.differs(job.fingerprint, moved=moved)
        if why:
            return f"the slide file changed since the bag was made: {why}"
    same = made.tile_params == job.tile_params and made.n_tiles_requested == job.tiles.n
    checks = (
        (same and _same_tiles(made, job), "the tiles changed"),
        (header.dtype == dtype, f"dtype {header.dtype} -> {dtype}"),
        (made.input_px == encoder.input_px, f"input size {made.input_px} -> {encoder.input_px} px"),
        (made.recipe_sha256 == encoder.recipe.digest(), "the encoder's recipe changed (or was not recorded)"),
        (
            (made.stain_norm, made.stain_reference_sha256)
            == (want["stain_norm"], want["stain_reference_sha256"]),
            f"stain normalisation {made.stain_norm or 'none'} -> {want['stain_norm'] or 'none'} "
            "(or another reference)",
        ),
    )
    return next((why for current, why in checks if not current), None)


def _same_tiles(made: BagProvenance, job: SlideJob) -> bool:
    """Whether the bag holds the tile file's tiles: by the digest it records (`tiles_sha256`); a bag from
    before the digest by its `coords_px`, each of which must be a tile of the file (the unreadable tiles
    it left out are the difference), or by the count alone when it has no `coords_px` either."""
    if made.tiles_sha256 is not None:
        return made.tiles_sha256 == coords_digest(job.tiles.coords_px)
    try:
        with open_bag_file(job.bag_path) as h5:
            if "coords_px" not in h5:
                return True
            n = int(feature_dataset(h5, job.bag_path).shape[0])
            held = np.asarray(coords_dataset(h5, job.bag_path, "coords_px", n)[()], dtype=np.int64)
    except WsiError:
        return False
    tiles = np.asarray(job.tiles.coords_px, dtype=np.int64).reshape(-1, 2)
    return bool(np.isin(held[:, 0] * (1 << 32) + held[:, 1], tiles[:, 0] * (1 << 32) + tiles[:, 1]).all())


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


def refused_row(slide_id: str, path: str, why: str) -> JobResult:
    log.warning("%s: refused: %s", slide_id, why)
    return JobResult(slide_id, path, "failed", error=why)


__all__ = ["Slide", "bag_dir", "plan", "read_tile_files", "refused_row", "stale"]

"""Batch inference with a trained run: feature bags, or raw slides streamed through tile -> embed.

`predict(model_dir=RUN_DIR, ...)` writes into `out_dir`:
  predictions.csv          slide (patient, slides at level: patient), the outputs (prob_<class>...,
                           predicted; pred_<target>; risk, risk_group), one row per case that succeeded
  patient_predictions.csv  (slide-level runs whose cohort has a patient with several slides, or with
                           --labels) patient, slides, the mean of its slides' outputs
  manifest.csv             slide, path, status (ok | skipped | empty | failed), tiles, seconds, error
                           (every case; `empty`: a raw slide that kept no tile, with the tiling reason)
  heatmaps/<slide>.png     each tile's contribution to the predicted class / target / risk (over the
                           slide thumbnail when predicting from slides or from bags whose recorded
                           `slide_path` is reachable, else on a blank canvas at the tile positions);
                           <slide>.<target>.png per target of multi-target runs; <slide>.json (wsi view)
  geojson/<slide>.geojson  every tile as a QuPath object in level-0 px with its contributions (and pooling
                           weight), the top tiles as annotations, the prediction (pipelines.predict.geojson)
  predict_progress.jsonl   each finished case (pipelines.predict_progress): predictions.csv and
                           manifest.csv are rewritten as cases finish, and a re-run skips finished ones
  top_tiles/               (top_tiles=K) the K tiles pushing each output most and least, read from the
                           slide, and a contact sheet per slide (pipelines.top_tiles)
  metrics.json, external_predictions.csv, report.html, report/
                           (labels_csv given) the task's figures on this cohort (pipelines.validation)
  work/                    (raw slides only) the tile files and bags made with the run's settings

The run's config.json records how its features were made (encoder, weights sha256, tile size and
every tiling parameter); raw slides are tiled and embedded with exactly those settings, by the tile
and embed stages' own code, and bags made by another encoder or weights are refused. A run folder of
cross-validation (fold-<k>/ folders) predicts with the mean output (probability, value, risk) of its
folds' best weights, each fold's outputs in label units by its own fitted values (fitted.json); a
survival ensemble splits high from low risk at the mean of the folds' training-median risks.

A case whose outputs are not finite (NaN features that slipped through, an overflow) fails in the
manifest with that reason: no row and no class is ever written from a NaN output.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.config import with_settings
from wsi.core.errors import WsiError
from wsi.core.files import write_csv_atomic
from wsi.core.progress import progress as progress_bar
from wsi.pipelines.inputs import Item, with_resolution
from wsi.pipelines.predict.config import PredictOptions
from wsi.pipelines.predict.explain import CaseOptions, explain_case
from wsi.pipelines.predict.external_validation import (
    Cohort,
    aggregate_by_patient,
    build_cohort,
    evaluate_cohort,
    write_patient_predictions,
)
from wsi.pipelines.predict.gather import BAGS, InputRoute, check_request, check_route, gather
from wsi.pipelines.predict.progress import Finished, Flusher, Progress, case_key, model_digest
from wsi.pipelines.predict.run_model import RunModel, load_run
from wsi.pipelines.predict.stream import stream_length, streamed_outputs
from wsi.pipelines.predict.top_tiles import TopTiles
from wsi.pipelines.runs.finished import refuse_unfinished
from wsi.pipelines.scheduling.jobs import describe_error, write_manifest
from wsi.pipelines.scheduling.remote import remote_edges
from wsi.pipelines.scheduling.results import JobResult, RunSummary, StageResult, Status
from wsi.pipelines.study.cases import CaseCollate, CaseDataset
from wsi.pipelines.study.kinds import TaskKind
from wsi.pipelines.study.labels import default_patient
from wsi.storage.folder_lock import output_lock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PredictResult(StageResult[JobResult]):
    """One row per case in `results` (failures included); the prediction table as written to
    predictions.csv in `rows`; with labels, what metrics.json holds in `metrics`."""

    predictions_csv: Path = field(default=Path(), kw_only=True)
    rows: list[dict[str, Any]] = field(default_factory=list, kw_only=True)  # slide (or patient), outputs
    metrics: dict[str, Any] | None = field(default=None, kw_only=True)
    level: str = field(default="slide", kw_only=True)  # a row: "slide", "image" or "patient"


def _finished_model(kwargs: dict[str, Any]) -> None:
    """A model whose training still runs or stopped early is refused (unless allow_unfinished)."""
    options, settings = kwargs.get("options"), kwargs
    allow = bool(settings.get("allow_unfinished", getattr(options, "allow_unfinished", False)))
    refuse_unfinished(kwargs["model_dir"], allow=allow)


@remote_edges(
    out="out_dir", folders={"features_dir": "--features folder"}, runs=("model_dir",), guard=_finished_model
)
def predict(
    *,
    model_dir: str | Path,
    out_dir: str | Path,
    inputs: Sequence[str | Path] = (),
    features_dir: str | Path | None = None,
    options: PredictOptions | None = None,
    **settings: Any,
) -> PredictResult:
    """Predict every slide (`inputs`: slides, folders, CSV lists) or every bag (`features_dir`).

    `options` (or its fields as keywords, `settings`; `PredictOptions` documents each): `weights` is the
    encoder's weights file for raw slides (checked against the sha256 the run recorded; refused where no
    encoder runs: bags, images, a run whose encoder was random); `mpp` the level-0 um/px of slides whose
    metadata has none, and of bags in level-0 pixels (CLAM, TRIDENT) when the model uses tile positions;
    `labels_csv` scores the predictions against a label table (external validation); `top_tiles` exports
    the K tiles pushing each output most and least per slide. Cases finished by an earlier call into the
    same `out_dir` with the same model, inputs and options are skipped unless `overwrite`. A bag of more
    than `stream_above_tiles` tiles is read chunk by chunk (no heatmap or top tiles for it, said in the
    manifest's `note`); None loads every bag whole.
    """
    opts = with_settings(PredictOptions, options, settings, source="predict options")
    check_request(inputs, features_dir, opts)
    t0 = time.perf_counter()
    run = load_run(model_dir, device=opts.device)
    route = InputRoute.of(run.adapter.name, features_dir)
    check_route(run, route, opts)
    out = Path(out_dir)
    with output_lock(out):  # one writer per output folder: predictions and manifest stay one record
        if not opts.overwrite:  # before any work: another model's predictions in --out are refused
            digest = model_digest(run.run_dir, run.checkpoints)
            Progress(out, fresh=False).check_model(digest, run.run_dir, out / "predictions.csv")
        gathered = gather(run, route, inputs, features_dir, out / "work", opts)
        cohort = build_cohort(gathered.found, task=run.record.task, kind=run.kind, labels_csv=opts.labels_csv)
        _prepare_adapter(run, cohort, gathered.found, opts)
        case_options = CaseOptions(
            heatmaps=opts.heatmaps, top_tiles=opts.top_tiles, thumbs=gathered.thumbs, backend=opts.backend,
            stream_above=opts.stream_above_tiles, geojson=opts.geojson,
        )  # fmt: skip
        done = _predict_cases(
            run, cohort.cases, out, case_options, progress=opts.progress, pre_failed=gathered.failed,
            overwrite=opts.overwrite,
        )  # fmt: skip
        if done.tiles is not None:
            done.tiles.write(out / "top_tiles")
        return _finish(run, cohort, out, opts, replace(done, results=[*gathered.failed, *done.results]), t0)


def _prepare_adapter(run: RunModel, cohort: Cohort, found: dict[str, Path], opts: PredictOptions) -> None:
    """The run's input adapter given the cohort's resolutions by the rules training used (labels CSV
    column, then --mpp, then the run's), and the inputs checked against the run's provenance."""
    recorded = run.record.input
    run.adapter = with_resolution(
        run.adapter, mpp=opts.mpp if opts.mpp is not None else recorded.mpp,
        mpp_by_slide={**recorded.mpp_by_slide, **cohort.mpp_by_slide},
        uses_positions=run.record.model.uses_positions, what="this run reads",
    )  # fmt: skip
    if found:
        run.adapter.check_compatible(run.provenance, [Item(id=s, path=p) for s, p in sorted(found.items())])


@dataclass(frozen=True)
class _Predicted:
    """What `_predict_cases` made: the prediction rows and their (n, K) outputs, one result per case,
    the top tiles collected, and the recorded cases of earlier calls with this model that it did not
    predict."""

    rows: list[dict[str, Any]]
    outputs: np.ndarray
    results: list[JobResult]
    tiles: TopTiles | None
    earlier: list[Finished]


def _finish(
    run: RunModel, cohort: Cohort, out: Path, opts: PredictOptions, done: _Predicted, t0: float
) -> PredictResult:
    """Patient means, external validation (with labels) and the summary line."""
    rows, outputs, results, earlier = done.rows, done.outputs, done.results, done.earlier
    task = run.record.task
    ids = [r["patient" if task.level == "patient" else "slide"] for r in rows]
    if task.level == "slide":
        _patient_means(out, run, ids, outputs, earlier, cohort, always=opts.labels_csv is not None)
    figures = None
    if opts.labels_csv is not None:
        figures = evaluate_cohort(
            task=task, kind=run.kind, cohort=cohort, ids=ids, outputs=outputs, out_dir=out
        )
    seconds = time.perf_counter() - t0
    noun, unit = ("slides", "tiles") if run.adapter.name == BAGS else ("images", "images")
    labels = {"ok": "predicted", "skipped": "already predicted"}
    csv_path = out / "predictions.csv"
    line = RunSummary.of(results, seconds).line("predict", noun=noun, unit=unit, labels=labels)
    log.info("%s; %s", line, csv_path)
    level = "image" if task.level == "slide" and run.adapter.name != BAGS else task.level
    return PredictResult("predict", out, tuple(results), seconds, manifest=out / "manifest.csv",
                         predictions_csv=csv_path, rows=rows, metrics=figures, level=level)  # fmt: skip


def _patient_means(
    out: Path, run: RunModel, ids: list[str], outputs: np.ndarray, earlier: list[Finished], cohort: Cohort,
    *, always: bool,
) -> None:  # fmt: skip
    """patient_predictions.csv over every slide predictions.csv holds (earlier calls' included), when a
    patient has several slides or `always` (a labelled cohort)."""
    all_ids = [*(f.case for f in earlier), *ids]
    before = np.asarray([f.output for f in earlier], dtype=np.float32).reshape(-1, outputs.shape[1])
    patient_of = {**{f.case: f.patient or default_patient(f.case) for f in earlier}, **cohort.patient_of}
    patients, slides, means = aggregate_by_patient(all_ids, np.concatenate([before, outputs]), patient_of)
    if always or len(patients) < len(all_ids):
        write_patient_predictions(out / "patient_predictions.csv", run.kind, patients, slides, means)


def _predict_cases(
    run: RunModel, cases: Sequence[Item], out: Path, options: CaseOptions, *, progress: bool,
    pre_failed: Sequence[JobResult] = (), overwrite: bool = False,
) -> _Predicted:  # fmt: skip
    """Each case through the model (a failure is recorded and the batch goes on), skipping cases a
    previous call finished; predictions.csv and manifest.csv are rewritten as cases finish (and when
    interrupted)."""
    kind = run.kind
    dataset = CaseDataset(run.adapter, cases, train=False, n_targets=len(kind.target_names))
    tiles = _top_tiles(run, options)
    rows: list[dict[str, Any]] = []
    outputs: list[np.ndarray] = []
    results: list[JobResult] = []
    id_column = "patient" if run.record.task.level == "patient" else "slide"

    done = Progress(out, fresh=overwrite)
    digest = model_digest(run.run_dir, run.checkpoints)
    # cases of earlier calls into this folder (other --features, other slides) stay, merged by case; the
    # manifest keeps their rows too (and drops them with --overwrite), so the two always agree
    earlier = done.earlier(digest, {c.id for c in cases})
    call = _Call(run, dataset, out, options, tiles, digest)

    def write() -> None:
        _write_rows(out / "predictions.csv", [*(f.row for f in earlier), *rows], kind, id_column)
        write_manifest(out / "manifest.csv", [*pre_failed, *results], keep_others=not overwrite)

    flusher = Flusher(write)
    try:
        for i, case in enumerate(progress_bar(cases, desc="predict", unit="case", disable=not progress)):
            streamed = stream_length(run, case, options.stream_above) is not None
            key = case_key(digest, case, _settings(run, case, options, streamed=streamed))
            finished = done.get(key)
            status: Status = "skipped"
            t0 = time.perf_counter()
            if finished is None:
                try:
                    finished = _predict_new(call, i, case, key, streamed=streamed)
                    done.add(finished)  # recorded before it counts: a full disk here fails this case only
                except Exception as exc:  # one bad slide never stops the batch
                    results.append(_failed(case, exc, t0))
                    continue
                status = "ok"
            elif tiles is not None:
                tiles.rows.extend(finished.top_rows)
                tiles.skipped.extend((str(a), str(b)) for a, b in finished.top_skipped)
            rows.append(finished.row)
            outputs.append(np.asarray(finished.output, dtype=np.float32))
            seconds = time.perf_counter() - t0
            results.append(
                JobResult(case.id, str(case.path), status, n=finished.n, seconds=seconds, note=finished.note)
            )
            flusher.maybe()
    finally:
        flusher.now()  # what finished is on disk, also after an interruption
    stacked = np.stack(outputs) if outputs else np.zeros((0, kind.num_outputs), dtype=np.float32)
    return _Predicted(rows, stacked, results, tiles, earlier)


def _top_tiles(run: RunModel, options: CaseOptions) -> TopTiles | None:
    """Where top tiles are collected, when asked for: they are read from slides, so an input without
    slides skips them, saying so."""
    tiles = TopTiles() if options.top_tiles and run.adapter.name == BAGS else None
    if options.top_tiles and tiles is None:
        log.warning("top tiles are read from slides: input %r has none; skipped", run.adapter.name)
    return tiles


@dataclass(frozen=True)
class _Call:
    """What every case of one `_predict_cases` call shares."""

    run: RunModel
    dataset: CaseDataset
    out: Path
    options: CaseOptions
    tiles: TopTiles | None
    digest: str


def _predict_new(call: _Call, i: int, case: Item, key: str, *, streamed: bool) -> Finished:
    """A case no earlier call finished: read chunk by chunk when too long to load whole (no heatmaps),
    else whole with its heatmaps and top tiles; stamped with the model that made it."""
    run, options = call.run, call.options
    if streamed:
        finished = _predict_streamed(run, case, key, options)
    else:
        finished = _predict_case(run, case, call.dataset[i], key, call.out, options, call.tiles)
    finished.model, finished.model_dir = call.digest, str(run.run_dir)
    finished.patient = case.patient
    return finished


def _failed(case: Item, exc: Exception, t0: float) -> JobResult:
    """The manifest row of a case that failed, its reason logged: the batch goes on."""
    why = describe_error(exc)
    log.warning("%s failed: %s", case.id, why)
    seconds = time.perf_counter() - t0
    return JobResult(case.id, str(case.path), "failed", seconds=seconds, error=why)


def _settings(run: RunModel, case: Item, options: CaseOptions, *, streamed: bool) -> dict[str, Any]:
    """What a case's result depends on besides the model and its input files (see predict_progress)."""
    mpp_for = getattr(run.adapter, "mpp_by_slide", {})
    run_mpp = getattr(run.adapter, "mpp", None)
    slide_ids = [sid for sid, _ in case.slides] or [case.id]
    settings = {
        "mpp": [mpp_for.get(sid, run_mpp) for sid in slide_ids],
        "heatmaps": options.heatmaps,
        "top_tiles": options.top_tiles,
        "backend": options.backend,
        "thumbs": [str(options.thumbs.get(sid, ("", None))[0]) for sid in slide_ids],
    }
    if not options.geojson:  # only when off: runs made before the GeoJSON existed keep their keys
        settings["geojson"] = False
    if streamed:  # made without heatmaps: predicted again when a later call would load it whole
        settings["streamed"] = True
    return settings


def _predict_case(
    run: RunModel,
    case: Item,
    sample: dict[str, Any],
    key: str,
    out: Path,
    options: CaseOptions,
    tiles: TopTiles | None,
) -> Finished:
    """One case: its outputs (refused when not finite), row, heatmaps and top tiles."""
    batch = CaseCollate(run.adapter)([sample]).to(run.device)
    output = run.outputs(batch.x, batch.model_inputs())[0].float().cpu().numpy()  # (K,)
    row = _row(run, case, output)
    files: list[str] = []
    top_from = (len(tiles.rows), len(tiles.skipped)) if tiles is not None else (0, 0)
    if options.heatmaps or options.geojson or tiles is not None:
        files = explain_case(run, case, sample, batch, output, out, options, tiles)
    n = int(sample["x"].shape[0]) if sample["x"].ndim == 2 else 1
    return Finished(
        key=key, case=case.id, row=row, output=[float(v) for v in output], n=n, files=files,
        top_rows=tiles.rows[top_from[0] :] if tiles is not None else [],
        top_skipped=[list(x) for x in tiles.skipped[top_from[1] :]] if tiles is not None else [],
    )  # fmt: skip


def _predict_streamed(run: RunModel, case: Item, key: str, options: CaseOptions) -> Finished:
    """One slide's bag too long to load, read chunk by chunk (pipelines.predict_stream)."""
    output, n = streamed_outputs(run, case)
    row = _row(run, case, output)
    note = ""
    if options.heatmaps or options.top_tiles or options.geojson:
        note = (
            f"bag of {n:,} tiles predicted streamed (more than {options.stream_above:,}); no heatmap, "
            "GeoJSON or top tiles: per-tile contributions need the whole bag in memory "
            "(--stream-above-tiles to change)"
        )
        log.warning("%s: %s", case.id, note)
    return Finished(key=key, case=case.id, row=row, output=[float(v) for v in output], n=n, note=note)


def _row(run: RunModel, case: Item, output: np.ndarray) -> dict[str, Any]:
    """The predictions.csv row of a case's outputs (K,); refused when they are not finite."""
    if not np.isfinite(output).all():
        values = ", ".join(f"{v:.3g}" for v in output)
        raise WsiError(
            f"{case.path}: the model's outputs are NaN or infinite ({values}); no prediction is made from "
            "them: check this input (`wsi info` on it) or re-create it"
        )
    kind = run.kind
    patient_level = run.record.task.level == "patient"
    row: dict[str, Any] = {"patient" if patient_level else "slide": case.id}
    if patient_level:
        row["slides"] = ";".join(sid for sid, _ in case.slides)
    row.update({c: float(v) for c, v in zip(kind.output_columns, output, strict=True)})
    row.update(zip(kind.derived_columns(), kind.derived_cells(output), strict=True))
    return row


def _write_rows(path: Path, rows: list[dict[str, Any]], kind: TaskKind, id_column: str) -> None:
    lead = [id_column, "slides"] if id_column == "patient" else [id_column]
    header = [*lead, *kind.output_columns, *kind.derived_columns()]
    floats = set(kind.output_columns)
    lines = ([f"{row[c]:.6f}" if c in floats else row[c] for c in header] for row in rows)
    write_csv_atomic(path, header, lines)


__all__ = ["Cohort", "PredictResult", "RunModel", "load_run", "predict"]

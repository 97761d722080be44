"""Batch inference with a trained run: feature bags, or raw slides streamed through tile -> embed.

`predict(model_dir=RUN_DIR, ...)` writes into `out_dir`:
  predictions.csv          slide (patient, slides at level: patient), the outputs (prob_<class>...,
                           predicted; pred_<target>; risk, risk_group), one row per case that succeeded
  patient_predictions.csv  (slide-level runs whose cohort has a patient with several slides, or with
                           --labels) patient, slides, the mean of its slides' outputs
  manifest.csv             slide, path, status (ok | failed), tiles, seconds, error (every case)
  heatmaps/<slide>.png     each tile's contribution to the predicted class / target / risk (over the
                           slide thumbnail when predicting from slides, on a blank canvas at the tile
                           positions for bags); <slide>.<target>.png per target of multi-target runs
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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from tqdm.auto import tqdm

from pipelines.cases import CaseCollate, CaseDataset
from pipelines.checkpoints import load_into
from pipelines.devices import autocast_for, resolve_device
from pipelines.heatmaps import slide_heatmap
from pipelines.inputs import Batch, InputAdapter, Item, build_input
from pipelines.jobs import JobResult, RunSummary, describe_error, write_manifest
from pipelines.kinds import TaskKind, build_kind
from pipelines.raw_slides import embed_raw_slides
from pipelines.run_record import RunRecord, read_fitted, read_run_record, record_path
from pipelines.top_tiles import TopTiles, export_slide
from pipelines.validation import (
    Cohort,
    aggregate_by_patient,
    build_cohort,
    evaluate_cohort,
    write_patient_predictions,
)
from wsi.errors import ConfigError
from wsi.files import write_csv_atomic

log = logging.getLogger(__name__)


@dataclass
class RunModel:
    """A trained run ready to predict: its models (one, or one per fold) with each one's kind (fitted
    values of its own training split), the run's kind (for files and figures), record and adapter."""

    models: list[torch.nn.Module]
    kinds: list[TaskKind]  # one per model
    kind: TaskKind  # the run's: columns, derived cells, figures (survival: the mean risk cut-off)
    record: RunRecord
    adapter: InputAdapter
    device: torch.device

    @property
    def classes(self) -> list[str]:
        return list(self.record.classes)

    @property
    def provenance(self) -> dict[str, Any]:
        return dict(self.record.input.provenance)

    def _mean(self, fn: Any, x: torch.Tensor, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        x = x.float() if x.dtype == torch.float16 else x
        with torch.inference_mode(), autocast_for(self.device)():
            pairs = zip(self.models, self.kinds, strict=True)
            return torch.stack([fn(m, k, x, extra).float() for m, k in pairs]).mean(0)

    def outputs(self, x: torch.Tensor, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, K): the kind's outputs (mean over the folds' models for a CV run)."""
        return self._mean(lambda m, k, x, e: k.outputs(m(x, **e).float()), x, extra)

    def probabilities(self, x: torch.Tensor, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, C) class probabilities of a categorical run (its outputs)."""
        return self.outputs(x, extra)

    def contributions(self, x: torch.Tensor, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, N, C): each token's contribution to each logit (mean over the folds' models)."""
        return self._mean(lambda m, k, x, e: m.tile_contributions(x, **e), x, extra)

    def explain(
        self, x: torch.Tensor, extra: dict[str, torch.Tensor], output: np.ndarray
    ) -> tuple[list[tuple[str, np.ndarray, str]], dict[str, np.ndarray]]:
        """(heatmaps: (file suffix, (N,) values, title), maps: {output: (N,)}) of the first case. Folds
        fitted alike share one mean contribution; else each fold's maps (in label units) are averaged."""
        if all(k.fitted() == self.kind.fitted() for k in self.kinds):
            contrib = self.contributions(x, extra)[0].cpu().numpy()  # (N, C)
            return self.kind.heatmap_maps(contrib, output), self.kind.contribution_maps(contrib)
        heat: dict[str, list[np.ndarray]] = {}
        titles: dict[str, str] = {}
        maps: dict[str, list[np.ndarray]] = {}
        for model, kind in zip(self.models, self.kinds, strict=True):
            xx = x.float() if x.dtype == torch.float16 else x
            with torch.inference_mode(), autocast_for(self.device)():
                contrib = cast(Any, model).tile_contributions(xx, **extra)[0].float().cpu().numpy()
            for suffix, values, title in kind.heatmap_maps(contrib, output):
                heat.setdefault(suffix, []).append(values)
                titles.setdefault(suffix, title)
            for name, values in kind.contribution_maps(contrib).items():
                maps.setdefault(name, []).append(values)
        mean = {k: np.mean(v, axis=0) for k, v in heat.items()}
        return [(k, mean[k], titles[k]) for k in heat], {k: np.mean(v, axis=0) for k, v in maps.items()}


def load_run(model_dir: str | Path, *, device: str = "auto") -> RunModel:
    """Rebuild a run's model(s) from its record + best.safetensors (safetensors only, never pickle)."""
    from models.presets import build_model_from_config

    run = Path(model_dir)
    if not record_path(run).is_file():
        raise ConfigError(f"--model {run}: no config.json; give the --out folder of `wsi train`")
    record = read_run_record(run)
    ckpts = _checkpoints(run, record)
    dev = resolve_device(device)
    models, kinds = [], []
    for ckpt in ckpts:
        model = build_model_from_config(record.model, source=str(record_path(run)))
        load_into(model, ckpt)
        models.append(model.to(dev).eval())
        kinds.append(build_kind(record.task, read_fitted(ckpt.parent)))
    fitted = kinds[0].fitted()
    cutoffs = [k.fitted().get("risk_cutoff") for k in kinds]
    if all(c is not None for c in cutoffs) and cutoffs:
        fitted["risk_cutoff"] = float(np.mean([float(c) for c in cutoffs if c is not None]))
    adapter = build_input(record.input.name, record.task.input_options)
    return RunModel(models, kinds, build_kind(record.task, fitted), record, adapter, dev)


def _checkpoints(run: Path, record: RunRecord) -> list[Path]:
    """best.safetensors, or every fold's of a cross-validation run (all K must have finished)."""
    ckpts = [run / "best.safetensors"]
    if not ckpts[0].is_file():
        ckpts = sorted(run.glob("fold-*/best.safetensors"), key=lambda p: int(p.parent.name.split("-")[1]))
    if not ckpts:
        raise ConfigError(
            f"--model {run}: no best.safetensors (nor fold-*/best.safetensors); did training finish?"
        )
    n_folds = record.cv
    if len(ckpts) > 1 and n_folds is not None and len(ckpts) != n_folds:
        have = sorted(p.parent.name for p in ckpts)
        raise ConfigError(
            f"--model {run}: a {n_folds}-fold run, but only {', '.join(have)} finished; "
            f"finish it with `wsi train ... --cv {n_folds} --resume` or predict with one fold's folder"
        )
    return ckpts


@dataclass
class PredictResult:
    out_dir: Path
    predictions_csv: Path
    rows: list[dict[str, Any]]  # slide (or patient, slides), the output columns, derived columns
    results: list[JobResult] = field(default_factory=list)  # one per case, failures included
    metrics: dict[str, Any] | None = None  # with labels_csv: what metrics.json holds

    @property
    def summary(self) -> RunSummary:
        return RunSummary.of(self.results)

    @property
    def failed(self) -> list[JobResult]:
        return list(self.summary.failed)


def predict(
    *,
    model_dir: str | Path,
    out_dir: str | Path,
    inputs: Sequence[str | Path] = (),
    features_dir: str | Path | None = None,
    device: str = "auto",
    heatmaps: bool = True,
    weights: str | Path | None = None,
    mpp: float | None = None,
    backend: str = "openslide",
    workers: int = 1,
    scheduler: str | None = None,
    progress: bool = True,
    labels_csv: str | Path | None = None,
    top_tiles: int = 0,
) -> PredictResult:
    """Predict every slide (`inputs`: slides, folders, CSV lists) or every bag (`features_dir`).

    `weights`: the encoder's weights file for raw slides (checked against the sha256 the run recorded;
    not needed when the run's features came from a random-initialised encoder). `labels_csv`: score
    the predictions against this label table (external validation). `top_tiles`: export the K tiles
    pushing each output most and least per slide (0 = off).
    """
    if bool(inputs) == (features_dir is not None):
        raise ConfigError("give either slides (PATH...) or --features DIR, not both and not neither")
    if top_tiles < 0:
        raise ConfigError(f"top_tiles must be 0 (off) or a positive number of tiles, not {top_tiles}")
    t0 = time.perf_counter()
    run = load_run(model_dir, device=device)
    task = run.record.task
    if labels_csv is not None and not Path(labels_csv).is_file():
        raise ConfigError(f"--labels {labels_csv} does not exist")
    out = Path(out_dir)
    thumbs: dict[str, tuple[Path, float | None]] = {}
    pre_failed: list[JobResult] = []
    if features_dir is not None:
        found = run.adapter.find([Path(features_dir)])
    else:
        if run.adapter.name != "bags":
            found = run.adapter.find([Path(p) for p in inputs])
        else:
            found, thumbs, pre_failed = embed_raw_slides(
                run.provenance, inputs, out / "work", weights=weights, mpp=mpp, backend=backend,
                workers=workers, scheduler=scheduler, device=device, progress=progress,
            )  # fmt: skip
    cohort = build_cohort(found, task=task, kind=run.kind, labels_csv=labels_csv)
    if found:
        run.adapter.check_compatible(run.provenance, [Item(id=s, path=p) for s, p in sorted(found.items())])
    options = _CaseOptions(heatmaps=heatmaps, top_tiles=top_tiles, thumbs=thumbs, backend=backend)
    rows, outputs, results, tiles = _predict_cases(run, cohort.cases, out, options, progress=progress)
    results = pre_failed + results
    id_column = "patient" if task.level == "patient" else "slide"
    csv_path = out / "predictions.csv"
    _write_rows(csv_path, rows, run.kind, id_column)
    write_manifest(out / "manifest.csv", results)
    if tiles is not None:
        tiles.write(out / "top_tiles")
    ids = [r[id_column] for r in rows]
    if task.level == "slide":
        patients, slides, means = aggregate_by_patient(ids, outputs, cohort.patient_of)
        if labels_csv is not None or len(patients) < len(ids):
            write_patient_predictions(out / "patient_predictions.csv", run.kind, patients, slides, means)
    figures = None
    if labels_csv is not None:
        figures = evaluate_cohort(
            task=task, kind=run.kind, cohort=cohort, ids=ids, outputs=outputs, out_dir=out
        )
    summary = RunSummary.of(results, time.perf_counter() - t0)
    noun, unit = ("slides", "tiles") if run.adapter.name == "bags" else ("images", "images")
    log.info("%s; %s", summary.line("predict", noun=noun, unit=unit, labels={"ok": "predicted"}), csv_path)
    return PredictResult(out_dir=out, predictions_csv=csv_path, rows=rows, results=results, metrics=figures)


@dataclass(frozen=True)
class _CaseOptions:
    heatmaps: bool
    top_tiles: int
    thumbs: dict[str, tuple[Path, float | None]]
    backend: str


def _predict_cases(
    run: RunModel, cases: Sequence[Item], out: Path, options: _CaseOptions, *, progress: bool
) -> tuple[list[dict[str, Any]], np.ndarray, list[JobResult], TopTiles | None]:
    """Each case through the model (a failure is recorded and the batch goes on); heatmaps and top
    tiles per slide. Returns (rows, (n, K) outputs of those rows, job results, top tiles)."""
    kind = run.kind
    dataset = CaseDataset(run.adapter, cases, train=False, n_targets=len(kind.target_names))
    collate = CaseCollate(run.adapter)
    tiles = TopTiles() if options.top_tiles and run.adapter.name == "bags" else None
    if options.top_tiles and tiles is None:
        log.warning("top tiles are read from slides: input %r has none; skipped", run.adapter.name)
    rows: list[dict[str, Any]] = []
    outputs: list[np.ndarray] = []
    results: list[JobResult] = []
    patient_level = run.record.task.level == "patient"
    for i, case in enumerate(tqdm(cases, desc="predict", disable=not progress)):
        t0 = time.perf_counter()
        try:
            sample = dataset[i]
            batch = collate([sample]).to(run.device)
            output = run.outputs(batch.x, batch.extra)[0].cpu().numpy()  # (K,)
            row: dict[str, Any] = {"patient" if patient_level else "slide": case.id}
            if patient_level:
                row["slides"] = ";".join(sid for sid, _ in case.slides)
            row.update({c: float(v) for c, v in zip(kind.output_columns, output, strict=True)})
            row.update(zip(kind.derived_columns(), kind.derived_cells(output), strict=True))
            if options.heatmaps or tiles is not None:
                _explain_case(run, case, sample, batch, output, out, options, tiles)
            rows.append(row)
            outputs.append(output)
            n = int(sample["x"].shape[0]) if sample["x"].ndim == 2 else 1
            results.append(JobResult(case.id, str(case.path), "ok", n=n, seconds=time.perf_counter() - t0))
        except Exception as exc:  # one bad slide never stops the batch
            log.warning("%s failed: %s", case.id, describe_error(exc))
            seconds, why = time.perf_counter() - t0, describe_error(exc)
            results.append(JobResult(case.id, str(case.path), "failed", seconds=seconds, error=why))
    stacked = np.stack(outputs) if outputs else np.zeros((0, kind.num_outputs))
    return rows, stacked, results, tiles


def _parts(case: Item, sample: dict[str, Any]) -> list[tuple[Item, dict[str, Any], slice]]:
    """(slide item, its own sample with its own coordinates, its tiles' slice of the case's tokens)."""
    if "parts" not in sample:
        return [(case, sample, slice(None))]
    out = []
    for part in sample["parts"]:
        sl = slice(part["start"], part["stop"])
        coords = sample["coords_um"][sl].clone()
        coords[:, 0] -= part["shift_um"]  # back to the slide's own positions
        item = Item(id=part["id"], path=Path(part["path"]), patient=case.patient)
        out.append((item, {"x": sample["x"][sl], "coords_um": coords}, sl))
    return out


def _explain_case(
    run: RunModel,
    case: Item,
    sample: dict[str, Any],
    batch: Batch,
    output: np.ndarray,
    out: Path,
    options: _CaseOptions,
    tiles: TopTiles | None,
) -> None:
    """Heatmaps and top tiles of each slide of a case, from the case's per-tile contributions."""
    heatmaps, maps = run.explain(batch.x, batch.extra, output)
    for item, part_sample, sl in _parts(case, sample):
        thumb = options.thumbs.get(item.id)
        if options.heatmaps:
            for suffix, values, title in heatmaps:
                png, label = out / "heatmaps" / f"{item.id}{suffix}.png", f"{item.id}: {title}"
                _heatmap(run, item, part_sample, batch, values[sl], png, label, thumb, options)
        if tiles is not None:
            try:
                export_slide(
                    slide_id=item.id, bag_path=item.path, maps={k: v[sl] for k, v in maps.items()},
                    k=options.top_tiles, out_dir=out / "top_tiles", slide=thumb, backend=options.backend,
                    collected=tiles,
                )  # fmt: skip
            except Exception as exc:  # the prediction stands; the crops are recorded as not made
                tiles.skipped.append((item.id, describe_error(exc)))


def _heatmap(
    run: RunModel,
    item: Item,
    sample: dict[str, Any],
    batch: Batch,
    values: np.ndarray,
    png: Path,
    title: str,
    thumb: tuple[Path, float | None] | None,
    options: _CaseOptions,
) -> None:
    """Values (N,) over the slide when predicting from slides, else drawn by the adapter (bags: at the
    tile positions; images: over the image)."""
    if thumb is not None:
        from wsi.bags import read_bag_attrs

        tile_um = float(read_bag_attrs(item.path)["tile_size_um"])
        slide_heatmap(thumb, sample["coords_um"].numpy(), tile_um, values, png, title, options.backend)
    elif hasattr(run.adapter, "heatmap"):
        grid = getattr(run.models[0], "grid_shape", None)
        extra = {"grid_shape": grid(batch.x.shape)} if grid is not None else {}
        run.adapter.heatmap(item, sample, torch.from_numpy(values), png, title=title, **extra)


def _write_rows(path: Path, rows: list[dict[str, Any]], kind: TaskKind, id_column: str) -> None:
    lead = [id_column, "slides"] if id_column == "patient" else [id_column]
    header = [*lead, *kind.output_columns, *kind.derived_columns()]
    floats = set(kind.output_columns)
    lines = ([f"{row[c]:.6f}" if c in floats else row[c] for c in header] for row in rows)
    write_csv_atomic(path, header, lines)


__all__ = ["Cohort", "PredictResult", "RunModel", "load_run", "predict"]

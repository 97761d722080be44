"""Batch inference with a trained run: feature bags, or raw slides streamed through tile -> embed.

`predict(model_dir=RUN_DIR, ...)` writes into `out_dir`:
  predictions.csv          slide, prob_<class>..., predicted (one row per slide that succeeded)
  manifest.csv             slide, path, status (ok | failed), tiles, seconds, error (every slide)
  heatmaps/<slide>.png     each tile's contribution to the predicted class (over the slide thumbnail
                           when predicting from slides, on a blank canvas at the tile positions for bags)
  work/                    (raw slides only) the tile files and bags made with the run's settings

The run's config.json records how its features were made (encoder, weights sha256, tile size and
every tiling parameter); raw slides are tiled and embedded with exactly those settings, by the tile
and embed stages' own code, and bags made by another encoder or weights are refused. A run folder of
cross-validation (fold-<k>/ folders) predicts with the mean probability of its folds' best weights.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from pipelines.checkpoints import load_into
from pipelines.devices import autocast_for, resolve_device
from pipelines.heatmaps import contribution_to_class, render_heatmap
from pipelines.inputs import Batch, InputAdapter, Item, build_input
from pipelines.jobs import JobResult, RunSummary, describe_error, write_manifest
from pipelines.run_record import RunRecord, read_run_record, record_path
from wsi.errors import ConfigError
from wsi.files import write_csv_atomic

log = logging.getLogger(__name__)

_PRECISIONS: dict[str, Literal["bf16", "fp16", "fp32"]] = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


@dataclass
class RunModel:
    """A trained run ready to predict: its models (one, or one per fold), record and input adapter."""

    models: list[torch.nn.Module]
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
            return torch.stack([fn(m, x, extra).float() for m in self.models]).mean(0)

    def probabilities(self, x: torch.Tensor, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, C): softmax of the model's logits (mean over the folds' models for a CV run)."""
        return self._mean(lambda m, x, e: torch.softmax(m(x, **e).float(), dim=-1), x, extra)

    def contributions(self, x: torch.Tensor, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, N, C): each token's contribution to each logit (mean over the folds' models)."""
        return self._mean(lambda m, x, e: m.tile_contributions(x, **e), x, extra)


def load_run(model_dir: str | Path, *, device: str = "auto") -> RunModel:
    """Rebuild a run's model(s) from its record + best.safetensors (safetensors only, never pickle)."""
    from models.presets import build_model_from_config

    run = Path(model_dir)
    if not record_path(run).is_file():
        raise ConfigError(f"--model {run}: no config.json; give the --out folder of `wsi train`")
    record = read_run_record(run)
    ckpts = _checkpoints(run, record)
    dev = resolve_device(device)
    models = []
    for ckpt in ckpts:
        model = build_model_from_config(record.model, source=str(record_path(run)))
        load_into(model, ckpt)
        models.append(model.to(dev).eval())
    adapter = build_input(record.input.name, record.task.input_options)
    return RunModel(models=models, record=record, adapter=adapter, device=dev)


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
    rows: list[dict[str, Any]]  # slide, prob_<class>..., predicted
    results: list[JobResult] = field(default_factory=list)  # one per slide, failures included

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
) -> PredictResult:
    """Predict every slide (`inputs`: slides, folders, CSV lists) or every bag (`features_dir`).

    `weights`: the encoder's weights file for raw slides (checked against the sha256 the run recorded;
    not needed when the run's features came from a random-initialised encoder).
    """
    if bool(inputs) == (features_dir is not None):
        raise ConfigError("give either slides (PATH...) or --features DIR, not both and not neither")
    t0 = time.perf_counter()
    run = load_run(model_dir, device=device)
    out = Path(out_dir)
    thumbs: dict[str, tuple[Path, float | None]] = {}
    pre_failed: list[JobResult] = []
    if features_dir is not None:
        found = run.adapter.find([Path(features_dir)])
    else:
        if run.adapter.name != "bags":
            found = run.adapter.find([Path(p) for p in inputs])
        else:
            found, thumbs, pre_failed = _embed_raw_slides(
                run, inputs, out / "work", weights=weights, mpp=mpp, backend=backend, workers=workers,
                scheduler=scheduler, device=device, progress=progress,
            )  # fmt: skip
    items = [Item(id=sid, path=path) for sid, path in sorted(found.items())]
    if items:
        run.adapter.check_compatible(run.provenance, items)
    rows, results = _classify(
        run, items, out, heatmaps=heatmaps, thumbs=thumbs, backend=backend, progress=progress
    )
    results = pre_failed + results
    csv_path = out / "predictions.csv"
    _write_rows(csv_path, rows, run.classes)
    write_manifest(out / "manifest.csv", results)
    summary = RunSummary.of(results, time.perf_counter() - t0)
    noun, unit = ("slides", "tiles") if run.adapter.name == "bags" else ("images", "images")
    log.info("%s; %s", summary.line("predict", noun=noun, unit=unit, labels={"ok": "predicted"}), csv_path)
    return PredictResult(out_dir=out, predictions_csv=csv_path, rows=rows, results=results)


def _classify(
    run: RunModel,
    items: Sequence[Item],
    out: Path,
    *,
    heatmaps: bool,
    thumbs: dict[str, tuple[Path, float | None]],
    backend: str,
    progress: bool,
) -> tuple[list[dict[str, Any]], list[JobResult]]:
    dataset = run.adapter.dataset(items, train=False)
    rows: list[dict[str, Any]] = []
    results: list[JobResult] = []
    for i, item in enumerate(tqdm(items, desc="predict", disable=not progress)):
        t0 = time.perf_counter()
        try:
            sample = dataset[i]
            batch = run.adapter.collate([sample]).to(run.device)
            probs = run.probabilities(batch.x, batch.extra)[0].cpu().numpy()  # (C,)
            pred = int(probs.argmax())
            row = {
                "slide": item.id,
                **{f"prob_{c}": float(p) for c, p in zip(run.classes, probs, strict=True)},
                "predicted": run.classes[pred],
            }
            if heatmaps:
                title = f"{item.id}: {run.classes[pred]} (p={probs[pred]:.3f})"
                _heatmap(run, item, sample, batch, pred, out / "heatmaps" / f"{item.id}.png", title,
                         thumb=thumbs.get(item.id), backend=backend)  # fmt: skip
            rows.append(row)
            n = int(sample["x"].shape[0]) if sample["x"].ndim == 2 else 1
            results.append(JobResult(item.id, str(item.path), "ok", n=n, seconds=time.perf_counter() - t0))
        except Exception as exc:  # one bad slide never stops the batch
            log.warning("%s failed: %s", item.id, describe_error(exc))
            results.append(
                JobResult(
                    item.id,
                    str(item.path),
                    "failed",
                    seconds=time.perf_counter() - t0,
                    error=describe_error(exc),
                )
            )
    return rows, results


def _heatmap(
    run: RunModel,
    item: Item,
    sample: dict[str, Any],
    batch: Batch,
    pred: int,
    png: Path,
    title: str,
    *,
    thumb: tuple[Path, float | None] | None,
    backend: str,
) -> None:
    """Each token's contribution to the predicted class: over the slide when predicting from slides,
    else drawn by the adapter (bags: at the tile positions; images: over the image)."""
    contrib = run.contributions(batch.x, batch.extra)[0].cpu().numpy()  # (N, C)
    values = contribution_to_class(contrib, pred)  # (N,)
    if thumb is not None:
        _slide_heatmap(thumb, item.path, sample, values, png, title, backend)
    elif hasattr(run.adapter, "heatmap"):
        grid = getattr(run.models[0], "grid_shape", None)
        extra = {"grid_shape": grid(batch.x.shape)} if grid is not None else {}
        run.adapter.heatmap(item, sample, torch.from_numpy(values), png, title=title, **extra)


def _slide_heatmap(
    thumb: tuple[Path, float | None],
    bag_path: Path,
    sample: dict[str, Any],
    values: np.ndarray,
    png: Path,
    title: str,
    backend: str,
) -> None:
    """Contributions over the slide's thumbnail (about 2,048 px on the long side)."""
    from wsi.bags import read_bag_attrs
    from wsi.slide import open_slide

    slide_path, mpp = thumb
    with open_slide(slide_path, backend=backend, mpp=mpp) as slide:
        w_px, h_px = slide.dimensions
        thumb_mpp = max(w_px, h_px) * slide.mpp / 2048.0
        image = slide.thumbnail_at(thumb_mpp)
        thumb_mpp = max(w_px, h_px) * slide.mpp / max(image.shape[:2])  # the size actually returned
    tile_um = float(read_bag_attrs(bag_path)["tile_size_um"])
    render_heatmap(
        coords_um=sample["coords_um"].numpy(), tile_size_um=tile_um, values=values, out_png=png,
        thumbnail=image, thumb_mpp=thumb_mpp, title=title,
    )  # fmt: skip


def _embed_raw_slides(
    run: RunModel,
    inputs: Sequence[str | Path],
    work: Path,
    *,
    weights: str | Path | None,
    mpp: float | None,
    backend: str,
    workers: int,
    scheduler: str | None,
    device: str,
    progress: bool,
) -> tuple[dict[str, Path], dict[str, tuple[Path, float | None]], list[JobResult]]:
    """Tile and embed slides with the run's recorded settings; returns (bags, slide paths, failures)."""
    from models.encoders import encoder_id_for
    from pipelines.embed.engine import EmbedOptions
    from pipelines.embed.stage import bag_dir, embed_slides
    from wsi.config import parse_config
    from wsi.sources import find_slides
    from wsi.tiling import TileParams

    prov = run.provenance
    encoder, sha = prov.get("encoder"), prov.get("weights_sha256")
    tile_params = prov.get("tile_params")
    if not encoder or not sha or not isinstance(tile_params, dict):
        raise ConfigError(
            "this run does not record how its features were made (encoder, weights sha256, tile params: "
            "bags from another tool?); embed the slides yourself and use --features DIR"
        )
    random_init = sha == "random"
    if not random_init and weights is None:
        raise ConfigError(
            f"the model was trained on features from encoder {encoder} with weights sha256 {sha[:16]}...; "
            "give those weights with --weights PATH"
        )
    precision = _PRECISIONS.get(str(prov.get("precision")), "bf16")  # bags of other tools: the default
    options = EmbedOptions(
        encoder=encoder, weights=None if random_init else str(weights), random_init=random_init,
        expected_sha256=None if random_init else sha, device=None if device == "auto" else device,
        input_px=prov.get("input_px") if encoder.startswith("timm:") else None, precision=precision,
    )  # fmt: skip
    sources = find_slides(inputs)
    params = parse_config(TileParams, tile_params, source="the run's recorded tile_params")
    results = embed_slides(
        sources, out_dir=work, options=options, tile_params=params,
        backend=backend, mpp=mpp, workers=workers, scheduler=scheduler, progress=progress,
    )  # fmt: skip
    folder = bag_dir(work, encoder_id_for(encoder))
    by_id = {s.slide_id: s for s in sources}
    found: dict[str, Path] = {}
    thumbs: dict[str, tuple[Path, float | None]] = {}
    failed: list[JobResult] = []
    for r in results:
        bag = folder / f"{r.slide_id}.h5"
        if r.status in ("ok", "skipped") and bag.is_file():
            found[r.slide_id] = bag
            src = by_id.get(r.slide_id)
            if src is not None:
                thumbs[r.slide_id] = (src.path, src.mpp if src.mpp is not None else mpp)
        else:
            failed.append(
                JobResult(r.slide_id, r.path, "failed", seconds=r.seconds, error=r.error or "no bag made")
            )
    return found, thumbs, failed


def _write_rows(path: Path, rows: list[dict[str, Any]], classes: Sequence[str]) -> None:
    header = ["slide", *[f"prob_{c}" for c in classes], "predicted"]
    lines = ([row["slide"], *[f"{row[f'prob_{c}']:.6f}" for c in classes], row["predicted"]] for row in rows)
    write_csv_atomic(path, header, lines)

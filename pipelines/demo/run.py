"""The end-to-end demo: two-class cohort -> tile -> embed -> train -> predict, and a survival study.

It exercises the same library calls a user's run makes, on slides the project generates itself, so it
works on a fresh machine with no data and no weights. The two classes differ in tissue texture (nuclei
density and size, stain hue); labels use the `nsclc-subtype` task's class names so the packaged task
is what trains.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from wsi.core.config import MAX_MPP, MAX_SEED, bounds_of, config_model, setting
from wsi.core.files import write_text_atomic
from wsi.models.encoders import encoder_id_for
from wsi.pipelines.demo.survival import run_survival_demo
from wsi.pipelines.embed import EmbedOptions, bag_dir, embed_tiles
from wsi.pipelines.predict.stage import predict
from wsi.pipelines.scheduling.results import JobResult, RunSummary
from wsi.pipelines.study.tasks import ModelOverrides
from wsi.pipelines.tile.findings import TileResult
from wsi.pipelines.tile.stage import tile_slides
from wsi.pipelines.train import train
from wsi.slides.sources import find_slides
from wsi.synthetic import Style, write_sample_slide
from wsi.tiling.params import TileParams

log = logging.getLogger(__name__)

#: style of the generated tissue for each class of the nsclc-subtype task
_CLASS_STYLE: dict[str, Style] = {"LUAD": "a", "LUSC": "b"}


@config_model
@dataclass(frozen=True)
class DemoOptions:
    """Size of the demo. Defaults finish in a few minutes on two CPU cores; `wsi demo` builds its
    options from these fields."""

    out_dir: Path = setting(
        Path("demo-out"), help="Folder for every output (re-using it resumes finished stages)."
    )
    slides_per_class: int = setting(
        10, ge=4, le=200, help="Labelled slides per class (split into train / validation / test by patient)."
    )
    new_slides: int = setting(
        2, ge=0, le=200, help="Unlabelled slides that predict reads raw (tile -> embed -> classify)."
    )
    slide_um: float = setting(1536.0, ge=256.0, le=100_000.0, help="Side of each sample slide in um.")
    slide_mpp: float = setting(0.5, gt=0, le=MAX_MPP, help="Level-0 um/px of the sample slides (20x: 0.5).")
    tile_um: float = setting(
        TileParams.tile_um, **bounds_of(TileParams, "tile_um"), help="Tile side in um (`wsi tile --tile-um`)."
    )
    tile_px: int = setting(
        TileParams.tile_px, **bounds_of(TileParams, "tile_px"), help="Tile side in pixels (`--tile-px`)."
    )
    encoder: str = setting("retccl", help="Encoder name (retccl or timm:<name>).")
    weights: Path | None = setting(
        None, existing="file",
        help="RetCCL checkpoint (best_ckpt.pth); without it the encoder is randomly initialised.",
    )  # fmt: skip
    epochs: int = setting(
        15, ge=1, le=1000, help="Training epochs (early stopping's patience is set to this too)."
    )
    workers: int = setting(1, ge=1, le=64, help="Slides processed in parallel (dask worker processes).")
    seed: int = setting(0, ge=0, le=MAX_SEED, help="Seeds the generated slides and the training.")
    model_overrides: ModelOverrides = field(default_factory=dict)  # models.build_model arguments


@dataclass(frozen=True)
class DemoResult:
    test_auroc: float | None  # None when the test split holds one class only
    outputs: dict[str, Path]
    seconds: float
    survival_c_index: float | None = None  # test C-index of the survival study (None: too few events)
    survival_logrank_p: float | None = None  # log-rank p of its Kaplan-Meier split
    planted: str = ""  # what the sample slides carry on purpose, and what the filters made of it


def _make_cohort(opts: DemoOptions) -> tuple[Path, Path, Path]:
    """Write labelled slides, unlabelled new slides and the label CSV (one patient per slide)."""
    labelled = opts.out_dir / "slides"
    new = opts.out_dir / "new-slides"
    rows = []
    i = 0
    for label, style in _CLASS_STYLE.items():
        for _ in range(opts.slides_per_class):
            slide_id = f"DEMO-{i:02d}-{label}"
            path = labelled / f"{slide_id}.svs"
            if not path.exists():
                write_sample_slide(path, size_um=opts.slide_um, mpp=opts.slide_mpp, style=style,
                                   seed=opts.seed * 1000 + i, texture="auto")
            rows.append({"slide": slide_id, "label": label, "patient": f"PATIENT-{i:02d}"})
            i += 1
    for j in range(opts.new_slides):
        label = list(_CLASS_STYLE)[j % 2]
        path = new / f"NEW-{j:02d}.svs"
        if not path.exists():
            write_sample_slide(path, size_um=opts.slide_um, mpp=opts.slide_mpp,
                               style=_CLASS_STYLE[label], seed=opts.seed * 1000 + 500 + j, texture="auto")
    labels = opts.out_dir / "labels.csv"
    lines = ["slide,label,patient"] + [f"{r['slide']},{r['label']},{r['patient']}" for r in rows]
    write_text_atomic(labels, "\n".join(lines) + "\n")
    return labelled, new, labels


def _failed(stage: str, results: Sequence[JobResult]) -> None:
    """Stop the demo when a stage failed a slide or left one empty (no silent success)."""
    bad = RunSummary.of(results).problems
    for r in bad:
        log.error("%s %s for %s: %s", stage, r.status, r.slide_id, r.error)
    if bad:
        raise RuntimeError(f"{stage}: {len(bad)} slide(s) failed or produced nothing; see the manifest")


def planted_note(out: Path, result: TileResult) -> str:
    """What the sample slides carry on purpose (`wsi.synthetic`: one blurred patch in the tissue of
    each) and what the blur filter made of it (each slide's `findings`), so that the manifest's "check
    filter: blurry removed ..." notes read as the demo working, not as a fault."""
    counts = [r.findings.counts for r in result if r.status in ("ok", "skipped") and r.findings is not None]
    tissue, blurry = sum(c.n_tissue for c in counts), sum(c.n_blurry for c in counts)
    share = f" ({blurry / tissue:.1%})" if tissue else ""
    return (
        f"each sample slide has a blurred patch planted in its tissue and no other artifact: the blur filter "
        f"removed {blurry} of {tissue} tissue tiles{share} over {len(counts)} slide(s), as intended (the "
        f"manifest's 'check filter: blurry' notes are about these patches; {out / 'qc'} shows them)"
    )


def run_demo(opts: DemoOptions) -> DemoResult:
    start = time.perf_counter()
    out = opts.out_dir
    out.mkdir(parents=True, exist_ok=True)
    log.info("demo 1/6: writing %d sample slides to %s", 2 * opts.slides_per_class + opts.new_slides, out)
    labelled, new, labels = _make_cohort(opts)

    log.info("demo 2/6: tile")
    params = TileParams(tile_um=opts.tile_um, tile_px=opts.tile_px)
    tiled = tile_slides(find_slides([labelled]), out_dir=out, params=params, workers=opts.workers)
    _failed("tile", tiled)
    planted = planted_note(out, tiled)
    log.info("demo: %s", planted)

    log.info("demo 3/6: embed with %s (%s)", opts.encoder,
             opts.weights if opts.weights else "random initialisation: no weights given")
    options = EmbedOptions(encoder=opts.encoder, weights=str(opts.weights) if opts.weights else None,
                           random_init=opts.weights is None, batch_size=32)
    _failed("embed", embed_tiles(out, out_dir=out, options=options, workers=opts.workers))
    features = bag_dir(out, encoder_id_for(opts.encoder))

    run_dir = out / "model"
    if (run_dir / "metrics.json").is_file():  # a finished run: re-use it, as the stages above do
        log.info("demo 4/6: train: finished run found in %s, re-used", run_dir)
        metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    else:
        log.info("demo 4/6: train (task nsclc-subtype, whole bags)")
        metrics = train(
            task="nsclc-subtype", features_dir=features, labels_csv=labels, out_dir=run_dir,
            epochs=opts.epochs, seed=opts.seed, model_overrides=dict(opts.model_overrides),
            overrides={"patience": opts.epochs}, resume=True,  # continues an interrupted demo
        ).metrics  # fmt: skip

    log.info("demo 5/6: predict new slides from raw pixels (tile -> embed -> classify)")
    pred_dir = out / "predictions"
    predict(model_dir=run_dir, inputs=[new], out_dir=pred_dir, weights=opts.weights, workers=opts.workers)
    log.info("demo 6/6: survival study on the same bags (task nsclc-os, Cox)")
    survival = run_survival_demo(
        features_dir=features, labels_csv=labels, out_dir=out, epochs=opts.epochs, seed=opts.seed,
        model_overrides=dict(opts.model_overrides),
    )  # fmt: skip
    auroc = metrics.get("auroc")
    outputs = {
        "sample slides": labelled,
        "labels": labels,
        "tiles + manifest": out / "tiles",
        "QC images": out / "qc",
        "feature bags": features,
        "model run": run_dir,
        "metrics": run_dir / "metrics.json",
        "predictions": pred_dir / "predictions.csv",
        "heatmaps": pred_dir / "heatmaps",
        **survival.outputs,
    }
    return DemoResult(
        test_auroc=None if auroc is None else float(auroc),
        survival_c_index=survival.c_index,
        survival_logrank_p=survival.logrank_p,
        planted=planted,
        outputs=outputs,
        seconds=time.perf_counter() - start,
    )


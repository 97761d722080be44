"""`zero_shot()`: classes named in words score bags of tile features or slide embeddings, without training.

Tile-level towers (conch-v1, plip): every tile's stored feature is mapped into the joint space, its
cosine similarity to each class embedding computed, and a slide's class score is the mean of the top-k
tile similarities (MI-Zero; CONCH zeroshot_path.py topj_pooling); probabilities are
softmax(logit_scale.exp() * scores) (run_mizero). Slide-level towers (titan, prism): the slide
embedding is mapped into the joint space and scored against the class embeddings (TITAN zero_shot:
softmax of the cosines) or every prompt (PRISM zero_shot: softmax over prompts, summed per class).
Refused inputs stop the run before any work (exit 2); a slide that fails while scored is recorded in
the manifest and the others go on.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wsi.core.config import with_settings
from wsi.core.files import write_csv_atomic
from wsi.core.output_lock import output_lock
from wsi.pipelines.scheduling.jobs import describe_error, write_manifest
from wsi.pipelines.zero_shot.config import ZeroShotOptions
from wsi.pipelines.zero_shot.inputs import Source, check_sources, find_inputs, read_embedding_vector
from wsi.pipelines.zero_shot.outputs import write_slide_maps
from wsi.pipelines.zero_shot.prompts import (
    PromptSet,
    TextClassifier,
    load_prompts,
    text_classifier,
    top_k_mean,
)
from wsi.pipelines.zero_shot.results import SlideScore, ZeroShotResult

log = logging.getLogger("wsi.pipelines.zero_shot")
#: tile features mapped into the joint space at once
CHUNK = 65_536


def zero_shot(
    inputs: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    out_dir: str | os.PathLike[str],
    prompts: str | os.PathLike[str] | PromptSet,
    tower: Any = None,
    options: ZeroShotOptions | None = None,
    **settings: Any,
) -> ZeroShotResult:
    """Score every bag or slide embedding in `inputs` against the classes of `prompts` (a YAML file, a
    packaged set's name such as "nsclc", or a PromptSet); settings are ZeroShotOptions' fields. `tower`:
    an already built text tower (its name must be `model`'s). Writes predictions.csv, manifest.csv,
    heatmaps/, geojson/ and, with labels_csv, metrics.json + report.html."""
    from wsi.models.text_encoders import get_spec

    opts = with_settings(ZeroShotOptions, options, settings, source="zero-shot options")
    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    out = Path(out_dir)
    t0 = time.perf_counter()
    sources = find_inputs(paths)
    name = tower.name if tower is not None else opts.model
    spec = tower.SPEC if tower is not None else get_spec(opts.model)
    slide_tiles = _slide_tile_encoder(spec)
    prompt_set = (
        prompts
        if isinstance(prompts, PromptSet)
        else load_prompts(Path(prompts) if not isinstance(prompts, str) else prompts, spec.templates)
    )
    # every refusal before any work (exit 2, naming the file) and before the weights load
    check_sources(sources, tower_name=name, spec=spec, tile_encoder_of_slide=slide_tiles)
    if opts.labels_csv is not None:  # label values that are no class are refused now, not after scoring
        _task_cohort(prompt_set.names, {s.slide_id: s.path for s in sources}, opts, name)
    tower = tower if tower is not None else build_tower(opts)
    check_sources(  # the same checkpoint; the width it maps
        sources, tower_name=name, spec=spec, tile_encoder_of_slide=slide_tiles,
        tower_sha=tower.weights_sha256, image_dim=tower.image_dim(),
    )  # fmt: skip
    device = _device(opts.device)
    tower.to(device)
    with output_lock(out):
        classifier = text_classifier(tower, prompt_set, out / "text_embeddings")
        slide_encoder = _slide_encoder(tower, sources, opts) if spec.level == "slide" else None
        rows, files = _score_all(sources, tower, classifier, slide_encoder, opts, out, device)
        scored = [r for r in rows if r.status == "ok"]
        _write_predictions(out, classifier, scored, spec.level)
        write_manifest(out / "manifest.csv", rows)
        metrics = _evaluate(classifier.classes, scored, opts, out, tower.name) if opts.labels_csv else None
    result = ZeroShotResult(
        "zero-shot", out, tuple(rows), time.perf_counter() - t0, manifest=out / "manifest.csv",
        model=tower.name, classes=tuple(classifier.classes), predictions_csv=out / "predictions.csv",
        metrics=metrics, files=tuple(files),
    )  # fmt: skip
    log.info(
        "zero-shot with %s: %d slide(s) scored, %d failed, in %.1f s; predictions in %s",
        tower.name, len(scored), len(result.failed), result.seconds, result.predictions_csv,
    )  # fmt: skip
    return result


def build_tower(opts: ZeroShotOptions) -> Any:
    """The text tower `opts.model` names, with its weights (or random ones) and tokenizer."""
    from wsi.models.text_encoders import build_text_encoder

    return build_text_encoder(
        opts.model, weights=opts.weights, random_init=opts.random_init, tokenizer=opts.tokenizer
    )


def _slide_tile_encoder(spec: Any) -> str | None:
    """A slide-level tower's tile encoder (its slide encoder's), whose bags it embeds here; None for tiles."""
    if spec.level != "slide":
        return None
    from wsi.models.slide_encoders import get_spec as slide_spec

    return str(slide_spec(spec.image_encoders[0]).tile_encoders[0])


def _score_all(
    sources: list[Source],
    tower: Any,
    classifier: TextClassifier,
    slide_encoder: Any,
    opts: ZeroShotOptions,
    out: Path,
    device: torch.device,
) -> tuple[list[SlideScore], list[str]]:
    """Every input's row (a failed one records why; one slide's failure never stops the others) and
    the files written for them."""
    rows: list[SlideScore] = []
    files: list[str] = []
    for src in sources:
        t1 = time.perf_counter()
        try:
            score, written = _score(src, tower, classifier, slide_encoder, opts, out, device)
        except Exception as exc:
            error = describe_error(exc)
            log.error("%s: %s", src.slide_id, error)
            score, written = SlideScore(src.slide_id, str(src.path), "failed", error=error), []
        score.seconds = time.perf_counter() - t1
        rows.append(score)
        files += written
    return rows, files


def _device(name: str) -> torch.device:
    from wsi.pipelines.scheduling.devices import resolve_device

    return resolve_device(name)


def _slide_encoder(tower: Any, sources: list[Source], opts: ZeroShotOptions) -> Any:
    """The tower's own slide encoder (same checkpoint) when some input is a bag to embed here."""
    if not any(s.kind == "bag" for s in sources):
        return None
    from wsi.models.slide_encoders import build_slide_encoder

    name = tower.SPEC.image_encoders[0]
    if tower.weights_sha256 == "random":
        return build_slide_encoder(name, random_init=True)
    return build_slide_encoder(name, weights=tower.weights_path)


def _score(
    src: Source,
    tower: Any,
    classifier: TextClassifier,
    slide_encoder: Any,
    opts: ZeroShotOptions,
    out: Path,
    device: torch.device,
) -> tuple[SlideScore, list[str]]:
    from wsi.formats.bags import read_bag

    if src.kind == "embedding":
        vec = torch.from_numpy(read_embedding_vector(src.path))[None]
        return _score_slide(src, tower, classifier, vec, 1, device), []
    bag = read_bag(src.path, mpp=opts.mpp, require_um=False)
    feats = torch.from_numpy(np.asarray(bag.feats))
    if not torch.isfinite(feats).all():
        raise ValueError(f"{src.path} holds non-finite features (NaN or inf); embed the slide again")
    if len(feats) == 0:
        raise ValueError(f"{src.path} holds no tiles")
    if slide_encoder is not None:
        coords = (
            None if bag.coords_um is None else torch.from_numpy(np.asarray(bag.coords_um, dtype=np.float32))
        )
        vec = slide_encoder.encode(feats, coords, float(bag.tile_um or 0))[None]
        return _score_slide(src, tower, classifier, vec, len(feats), device), []
    with torch.no_grad():
        sims = torch.cat(
            [
                classifier.similarities(tower.image_to_joint(feats[s : s + CHUNK].to(device)).cpu())
                for s in range(0, len(feats), CHUNK)
            ]
        )
    pooled = top_k_mean(sims, opts.top_k)
    probs = classifier.probabilities(pooled=pooled[None])[0].numpy()
    predicted = classifier.classes[int(np.argmax(probs))]
    maps = {c: sims[:, i].numpy() for i, c in enumerate(classifier.classes)}
    written = write_slide_maps(
        out,
        slide_id=src.slide_id,
        bag=bag,
        maps=maps,
        predicted=predicted,
        probs=dict(zip(classifier.classes, probs.tolist(), strict=True)),
        options=opts,
    )
    return _row(src, classifier, probs, pooled.numpy(), len(feats)), written


def _score_slide(
    src: Source, tower: Any, classifier: TextClassifier, vec: torch.Tensor, n: int, device: torch.device
) -> SlideScore:
    if not torch.isfinite(vec).all():
        raise ValueError(f"{src.path}: the slide embedding is not finite")
    with torch.no_grad():
        joint = tower.image_to_joint(vec.to(device)).cpu()
    sims = classifier.similarities(joint)
    probs = classifier.probabilities(pooled=sims, joint=joint)[0].numpy()
    return _row(src, classifier, probs, sims[0].numpy(), n)


def _row(
    src: Source, classifier: TextClassifier, probs: np.ndarray, scores: np.ndarray, n: int
) -> SlideScore:
    predicted = classifier.classes[int(np.argmax(probs))]
    return SlideScore(src.slide_id, str(src.path), "ok", n, probs=probs, scores=scores, predicted=predicted)


def _write_predictions(out: Path, classifier: TextClassifier, scores: list[SlideScore], level: str) -> None:
    cls = classifier.classes
    score_name = "topk_similarity" if level == "tile" else "similarity"
    header = ["slide", *[f"prob_{c}" for c in cls], "predicted", *[f"{score_name}_{c}" for c in cls], "tiles"]
    rows = (
        [
            s.slide_id,
            *[f"{p:.6f}" for p in s.probs],
            s.predicted,
            *[f"{v:.6f}" for v in s.scores],
            s.n,
        ]
        for s in scores
    )
    write_csv_atomic(out / "predictions.csv", header, rows)


def _task_cohort(classes: list[str], found: dict[str, Path], opts: ZeroShotOptions, model: str) -> Any:
    """(task, kind, cohort) of the labelled slides, as `wsi predict --labels` builds them."""
    from wsi.pipelines.predict.external_validation import build_cohort
    from wsi.pipelines.study.kinds import build_kind
    from wsi.pipelines.study.tasks import TaskConfig

    task = TaskConfig(
        name=f"zero-shot {model}", classes=tuple(classes), bootstrap=opts.bootstrap, seed=opts.seed
    )
    kind = build_kind(task)
    return task, kind, build_cohort(found, task=task, kind=kind, labels_csv=opts.labels_csv)


def _evaluate(
    classes: list[str], scored: list[SlideScore], opts: ZeroShotOptions, out: Path, model: str
) -> dict[str, Any] | None:
    """predict's external validation on the labelled slides: metrics.json, bootstrap CIs, report.html."""
    from wsi.pipelines.predict.external_validation import evaluate_cohort

    if not scored:
        return None
    task, kind, cohort = _task_cohort(classes, {s.slide_id: Path(s.path) for s in scored}, opts, model)
    ids = [c.id for c in cohort.cases]
    probs = {s.slide_id: s.probs for s in scored}
    return evaluate_cohort(
        task=task, kind=kind, cohort=cohort, ids=ids, outputs=np.stack([probs[i] for i in ids]), out_dir=out
    )

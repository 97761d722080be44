"""Raw slides for a run trained on slide embeddings: tile encoder, then slide encoder, then the head.

The run's config.json records the embeddings' provenance: the slide encoder and its weights sha256,
and (`tile_provenance`) how the tile features under them were made. The slides are tiled and embedded
with those settings by `pipelines.raw_slides` (tile-encoder weights checked against the recorded
sha256), then `pipelines.embed_slides` makes each slide's embedding (slide-encoder weights checked the
same way). Every slide comes back: with its embedding, or as a failed/empty row with the stage's reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from wsi.core.errors import ConfigError
from wsi.pipelines.predict.config import PredictOptions
from wsi.pipelines.scheduling.results import JobResult


def _check_slide_weights(name: str, sha: str, slide_weights: str | Path | None) -> None:
    """--slide-weights must be given exactly when the head's slide encoder had weights, and be those
    (sha256), before any slide is tiled."""
    if sha == "random" and slide_weights is not None:
        raise ConfigError(f"the head was trained on embeddings of a randomly initialised {name}: leave out "
                          "--slide-weights")  # fmt: skip
    if sha != "random" and slide_weights is None:
        raise ConfigError(f"the head was trained on {name} embeddings (weights sha256 {sha[:16]}...); give "
                          "those weights with --slide-weights PATH")  # fmt: skip
    if slide_weights is not None:
        from wsi.core.files import sha256_file
        from wsi.models.slide_encoders import get_spec
        from wsi.models.slide_encoders.base import resolve_weights_file

        path = Path(slide_weights)
        got = sha256_file(resolve_weights_file(path, get_spec(name), name))
        if got != sha:
            raise ConfigError(
                f"--slide-weights {path} (sha256 {got[:16]}...) are not the {name} weights the head was "
                f"trained on ({sha[:16]}...)"
            )


def embed_raw_slides_to_embeddings(
    provenance: Mapping[str, Any], inputs: Sequence[str | Path], work: Path, opts: PredictOptions
) -> tuple[dict[str, Path], dict[str, tuple[Path, float | None]], list[JobResult]]:
    """(embedding by slide id, (slide path, mpp) by slide id, the slides that failed), with `wsi
    predict`'s options (the caller drops the thumbnails: one vector a slide, no slide heatmaps)."""
    from wsi.pipelines.embed_slides import embed_slides
    from wsi.pipelines.predict.raw_slides import embed_raw_slides

    name, sha = (
        str(provenance.get("encoder") or ""),
        str(provenance.get("slide_encoder_weights_sha256") or ""),
    )
    tile_prov = provenance.get("tile_provenance") or {}
    if not name or not sha or not tile_prov:
        raise ConfigError(
            "this run's embeddings do not record how their tile features were made (STAMP's, or older "
            "files); make the embeddings yourself and use --features DIR"
        )
    slide_weights, device = opts.slide_weights, opts.device
    _check_slide_weights(name, sha, slide_weights)
    bags, thumbs, failed = embed_raw_slides(tile_prov, inputs, work, opts)
    if not bags:
        return {}, thumbs, failed
    embedded = embed_slides(
        _bag_links(work, bags), out_dir=work, encoder=name, weights=slide_weights,
        random_init=sha == "random", device="cpu" if device == "auto" else device,
    )  # fmt: skip
    found: dict[str, Path] = {}
    for r in embedded:
        path = embedded.folder / f"{r.slide_id}.h5"
        if r.status in ("ok", "skipped") and path.is_file():
            found[r.slide_id] = path
        else:
            failed.append(JobResult(r.slide_id, r.path, "failed", seconds=r.seconds, error=r.error))
    return found, thumbs, failed


def _bag_links(work: Path, bags: Mapping[str, Path]) -> Path:
    """One folder of exactly these bags (links, no copies), for the slide encoder to read."""
    folder = work / "bags-for-slide-encoder"
    folder.mkdir(parents=True, exist_ok=True)
    for slide_id, bag in bags.items():
        link = folder / f"{slide_id}.h5"
        link.unlink(missing_ok=True)
        link.symlink_to(bag.resolve())
    return folder

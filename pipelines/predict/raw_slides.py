"""Raw slides for `wsi predict`: tiled and embedded exactly as a run's training bags were made.

The run's config.json records how its features were made (encoder, weights sha256, tile size and every
tiling parameter); the tile and embed stages' own code makes the bags again with those settings, and
weights that are not the recorded ones are refused (and so are weights given to a run whose encoder was
randomly initialised: there is nothing for them to match). Every slide given comes back: with its bag,
or as a failed row with the tile or embed stage's reason, or as `empty` (kept no tile) with the
tiling's reason, never silently left out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from wsi.core.errors import ConfigError
from wsi.pipelines.scheduling.results import JobResult

if TYPE_CHECKING:
    from wsi.pipelines.embed.engine import EmbedOptions
    from wsi.pipelines.predict.config import PredictOptions

_PRECISIONS: dict[str, Literal["bf16", "fp16", "fp32"]] = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


def embed_raw_slides(
    provenance: Mapping[str, Any], inputs: Sequence[str | Path], work: Path, opts: PredictOptions
) -> tuple[dict[str, Path], dict[str, tuple[Path, float | None]], list[JobResult]]:
    """Tile and embed slides with a run's recorded settings (its input `provenance`) and `wsi predict`'s
    options (weights, mpp, backend, workers, scheduler, device, progress); returns (bags by slide id,
    (slide path, mpp) by slide id, the slides that failed)."""
    from wsi.core.config import parse_config
    from wsi.models.encoders import encoder_id_for
    from wsi.pipelines.embed.stage import bag_dir, tile_and_embed
    from wsi.pipelines.tile.config import TileOptions
    from wsi.slides.sources import find_slides
    from wsi.tiling.params import TileParams

    options = _embed_options(provenance, opts.weights, opts.device)
    sources = find_slides(inputs)
    params = parse_config(TileParams, provenance["tile_params"], source="the run's recorded tile_params")
    backend, mpp = opts.backend, opts.mpp
    reading = parse_config(TileOptions, {"backend": backend, "mpp": mpp}, source="the run's slide reading")
    results = tile_and_embed(
        sources, out_dir=work, options=options, tile_params=params, tile_options=reading,
        workers=opts.workers, scheduler=opts.scheduler, progress=opts.progress,
    )  # fmt: skip
    folder = bag_dir(work, encoder_id_for(provenance["encoder"]))
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
                where = cast(Path, src.path)  # a Url for a remote slide: open_slide takes either
                thumbs[r.slide_id] = (where, _tiled_mpp(bag, src.mpp if src.mpp is not None else mpp))
        else:  # an embed stage that reports empty slides itself keeps that status here
            status: Literal["empty", "failed"] = "empty" if r.status == "empty" else "failed"
            why = r.error or "no bag made"
            failed.append(JobResult(r.slide_id, r.path, status, seconds=r.seconds, error=why))
    return found, thumbs, failed + _unreported(sources, results, work)


def _embed_options(provenance: Mapping[str, Any], weights: str | Path | None, device: str) -> EmbedOptions:
    """The embed settings the run's features were made with; refused before any work when they cannot be
    matched (no record, stain-normalised features, weights given for a random encoder or missing)."""
    from wsi.pipelines.embed.engine import EmbedOptions

    prov = provenance
    encoder, sha = prov.get("encoder"), prov.get("weights_sha256")
    tile_params = prov.get("tile_params")
    if not encoder or not sha or not isinstance(tile_params, dict):
        raise ConfigError(
            "this run does not record how its features were made (encoder, weights sha256, tile params: "
            "bags from another tool?); embed the slides yourself and use --features DIR"
        )
    if prov.get("stain_norm"):
        raise ConfigError(
            f"this run was trained on features of stain-normalised tiles ({prov['stain_norm']}); predicting "
            "raw slides does not re-apply it yet: embed them with `wsi embed --stain-norm "
            f"{prov['stain_norm']} --stain-reference <the training reference>` and predict with --features"
        )
    random_init = sha == "random"
    if random_init and weights is not None:
        raise ConfigError(
            f"the model was trained on features from a randomly initialised {encoder} (no weights file); "
            "--weights cannot apply: leave it out"
        )
    if not random_init and weights is None:
        raise ConfigError(
            f"the model was trained on features from encoder {encoder} with weights sha256 {sha[:16]}...; "
            "give those weights with --weights PATH"
        )
    precision = _PRECISIONS.get(str(prov.get("precision")), "bf16")  # bags of other tools: the default
    return EmbedOptions(
        encoder=encoder, weights=None if random_init else str(weights), random_init=random_init,
        expected_sha256=None if random_init else sha, device=device,
        input_px=prov.get("input_px") if encoder.startswith("timm:") else None, precision=precision,
    )  # fmt: skip


def _tiled_mpp(bag: Path, given: float | None) -> float | None:
    """The level-0 um/px the tile stage used for this slide, as its bag records it: a slide's metadata
    wins over --mpp there, so heatmaps and top tiles must not open the slide with --mpp instead."""
    from wsi.core.errors import WsiError
    from wsi.formats.bags import read_bag_attrs

    with contextlib.suppress(OSError, ValueError, WsiError):
        recorded = read_bag_attrs(bag).get("mpp")
        if recorded is not None:
            return float(recorded)
    return given


def _unreported(sources: Sequence[Any], results: Sequence[JobResult], work: Path) -> list[JobResult]:
    """Rows for the slides the embed stage returned nothing for: an `empty` slide (the tile stage kept
    no tile; its reason from work/tiles/manifest.csv), else a failure saying so."""
    from wsi.pipelines.scheduling.jobs import read_manifest

    reported = {r.slide_id for r in results}
    missing = [s for s in sources if s.slide_id not in reported]
    if not missing:
        return []
    tiled: dict[str, JobResult] = {}
    manifest = work / "tiles" / "manifest.csv"
    if manifest.is_file():
        with contextlib.suppress(OSError, ValueError, KeyError):
            tiled = {r.slide_id: r for r in read_manifest(manifest)}
    rows = []
    for src in missing:
        tile = tiled.get(src.slide_id)
        if tile is not None and tile.status == "empty":
            rows.append(JobResult(src.slide_id, str(src.path), "empty", error=tile.error or "kept no tile"))
        else:
            why = "the tile stage made no tiles"
            if tile is not None and tile.error:
                why = f"tiling: {tile.error}"
            rows.append(JobResult(src.slide_id, str(src.path), "failed", error=f"no bag made ({why})"))
    return rows


__all__ = ["embed_raw_slides"]

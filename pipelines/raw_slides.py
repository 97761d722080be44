"""Raw slides for `wsi predict`: tiled and embedded exactly as a run's training bags were made.

The run's config.json records how its features were made (encoder, weights sha256, tile size and every
tiling parameter); the tile and embed stages' own code makes the bags again with those settings, and
weights that are not the recorded ones are refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pipelines.jobs import JobResult
from wsi.errors import ConfigError

_PRECISIONS: dict[str, Literal["bf16", "fp16", "fp32"]] = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


def embed_raw_slides(
    provenance: Mapping[str, Any],
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
    """Tile and embed slides with a run's recorded settings (its input `provenance`); returns (bags by
    slide id, (slide path, mpp) by slide id, the slides that failed)."""
    from models.encoders import encoder_id_for
    from pipelines.embed.engine import EmbedOptions
    from pipelines.embed.stage import bag_dir, embed_slides
    from wsi.config import parse_config
    from wsi.sources import find_slides
    from wsi.tiling import TileParams

    prov = provenance
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


__all__ = ["embed_raw_slides"]

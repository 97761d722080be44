"""Tile-feature bags and slide embeddings as `wsi embed` and `wsi embed-slides` write them, for the
slide-encoder and slide-head tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wsi.formats.bags import BagProvenance, read_bag, write_bag
from wsi.pipelines.embed_slides import EmbeddingProvenance, write_embedding


def make_bag(
    path: Path, *, encoder: str = "conch-v1.5", dim: int = 768, n: int = 40, tile_um: float = 256.0,
    mpp: float = 0.5, sha: str = "a" * 64, seed: int = 0,
) -> np.ndarray:  # fmt: skip
    rng = np.random.default_rng(seed)
    feats = rng.normal(size=(n, dim)).astype(np.float32)
    coords_um = np.stack([np.arange(n) % 8, np.arange(n) // 8], axis=1).astype(np.float32) * tile_um
    prov = BagProvenance(
        slide_id=path.stem, encoder=encoder, weights_sha256=sha, tile_um=tile_um,
        tile_px=round(tile_um / mpp), mpp=0.25, level0_width=9000, level0_height=9000,
        tile_params={"tile_um": tile_um}, target_mpp=mpp,
    )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bag(path, feats=feats, coords_um=coords_um, coords_px=(coords_um / 0.25).astype(np.int64),
              provenance=prov, dtype="float32")  # fmt: skip
    return feats


def embed_by_mean(bags: Path, out: Path, encoder: str = "toy-slide", sha: str = "b" * 64) -> Path:
    """Slide embeddings as files of `wsi embed-slides` (the mean tile feature stands in for a model)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(bags.glob("*.h5")):
        bag = read_bag(path)
        prov = EmbeddingProvenance(
            id=path.stem, feat_type="slide", slide_encoder=encoder, slide_encoder_weights_sha256=sha,
            tile_encoder="test-encoder", tile_encoder_weights_sha256="0" * 64, tile_um=256.0,
            target_mpp=1.0, n_tiles=len(bag), source_bags=(str(path),),
        )  # fmt: skip
        write_embedding(out / f"{path.stem}.h5", bag.feats.mean(0), prov)
    return out

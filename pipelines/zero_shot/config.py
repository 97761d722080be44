"""The settings of a zero-shot run: one typed config that `zero_shot()` validates its keywords against and
`wsi zero-shot` builds its options from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wsi.core.config import MAX_MPP, config_model, setting

#: tiles pooled per class (MI-Zero's top-K mean; the CONCH authors report K in 1, 5, 10, 50, 100)
DEFAULT_TOP_K = 50


@config_model
@dataclass(frozen=True)
class ZeroShotOptions:
    """How prompts score bags or slide embeddings; which tower comes from --model."""

    model: str = setting(
        "conch-v1",
        help="Text tower: conch-v1, plip (tile features in bags), titan, prism (slide embeddings).",
    )
    weights: str | None = setting(
        None,
        default_text="the Hugging Face cache",
        help="The model's checkpoint (file or folder; hf:ORG/REPO); the same file as the image side's.",
    )
    tokenizer: Path | None = setting(
        None,
        existing="any",
        default_text="beside the weights",
        help="Tokenizer file or folder (CONCH: conch_byte_level_bpe_uncased.json from the authors' code).",
    )
    random_init: bool = setting(False, help="Random text tower (tests, the demo): its scores mean nothing.")
    top_k: int = setting(
        DEFAULT_TOP_K, ge=1, le=100_000, help="Tiles whose similarities are averaged per class."
    )
    labels_csv: Path | None = setting(
        None,
        existing="file",
        help="Label table (slide,label): metrics with bootstrap intervals and report.html.",
    )
    heatmaps: bool = setting(True, help="Per-class tile-score heatmaps over the slide (tile-level models).")
    geojson: bool = setting(True, help="geojson/<slide>.geojson: tiles with each class's score for QuPath.")
    mpp: float | None = setting(
        None, gt=0, le=MAX_MPP, help="Level-0 um/px for bags without it (CLAM, TRIDENT layouts)."
    )
    device: str = setting("auto", help="Device: auto (CUDA, MPS, CPU), cpu, cuda, cuda:N, mps.")
    bootstrap: int = setting(1000, ge=0, le=100_000, help="Bootstrap resamples of every 95% interval.")
    top: int = setting(20, ge=1, le=10_000, help="Retrieval (--query, --query-tile): the tiles kept.")
    seed: int = setting(1337, ge=0, le=2**31 - 1, help="Seed of the bootstrap.")

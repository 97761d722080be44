"""The settings of a slide-embedding run: one typed config that `embed_slides()` validates its
keywords against and `wsi embed-slides` builds its options from (defaults, choices and help once)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from wsi.core.config import config_model, setting
from wsi.core.errors import ConfigError
from wsi.pipelines.scheduling.remote import Location


def _slide_encoder_names() -> list[str]:
    from wsi.models.slide_encoders import SLIDE_ENCODERS

    return SLIDE_ENCODERS.names()


@config_model
@dataclass(frozen=True)
class SlideEmbedOptions:
    """Which slide encoder embeds the bags, at which level, on which device."""

    encoder: str = setting(
        choices=_slide_encoder_names, help="Slide encoder name (see `wsi encoders --slide`)."
    )
    #: a path, a URL or hf:ORG/REPO, kept as given (a Path would fold s3:// to s3:/)
    weights: str | Path | None = setting(
        None, help="The authors' checkpoint file, their model folder, or hf:ORG/REPO [default: a Hub model's "
        "file in the Hugging Face cache].",
    )  # fmt: skip
    random_init: bool = setting(False, help="No weights: random embeddings, for tests and demos only.")
    level: Literal["slide", "patient"] = setting(
        "slide", help="One embedding per slide, or per patient (needs --slide-table)."
    )
    slide_table: Location = setting(
        None, existing="file", help="CSV with `patient` and `slide` columns, for --level patient."
    )
    device: str = setting("auto", help="Device: auto (CUDA, MPS, CPU), cpu, cuda, cuda:N, mps.")
    overwrite: bool = setting(False, help="Redo embeddings that already exist.")

    def __post_init__(self) -> None:
        if self.level == "patient" and self.slide_table is None:
            raise ConfigError("--level patient needs --slide-table CSV (columns patient, slide)")


__all__ = ["SlideEmbedOptions"]

"""What every slide encoder shares: its published facts, the registry, exact chunked attention pooling,
and weights read as tensors and checked key by key in the authors' layout.

A slide encoder turns one bag of tile features (N, D) and their positions into one vector. Each member
is a `SlideEncoder` subclass in its own module with `@SLIDE_ENCODERS.register("name")` and a `SPEC`:
which tile encoder, tile size and resolution its features must come from, its output width, the
published parameter count, licence, weights page and the authors' file (and commit) it follows.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from wsi.core.errors import ConfigError, WeightsError
from wsi.core.json_types import JsonObject
from wsi.core.registry import Registry
from wsi.formats.hdf5 import to_stored
from wsi.models.slide_encoders.names import ENCODER_MODULES
from wsi.storage.hf import hub_weights, repo_of

log = logging.getLogger("wsi.models.slide_encoders")

StateDict = dict[str, torch.Tensor]
#: tiles scored at once by the chunked pooling: bounds activation memory on 100,000-tile slides
CHUNK_TILES = 8192


@dataclass(frozen=True)
class SlideEncoderSpec:
    """The published facts of one slide encoder (what `wsi encoders` lists and what is checked)."""

    tile_encoders: tuple[str, ...]  # wsi tile-encoder names whose bags it accepts
    tile_um: float  # tile side the authors used, micrometres
    tile_mpp: float  # um/px of those tiles
    in_dim: int  # tile feature width
    dim: int  # slide embedding width
    params: int  # parameter count of the published architecture (checked by the tests)
    licence: str
    weights_page: str
    weights_files: tuple[str, ...]  # file names inside the authors' model folder, first preferred
    reference: str  # the authors' code this module follows (repository, file, commit)
    uses_positions: bool
    patient_fusion: str  # "early": a patient's tiles pooled as one bag | "late": mean of slide embeddings
    #: sha256 of the tile encoder weights it was trained on, when that tile encoder has several (CHIEF's
    #: own CTransPath); empty: any weights of the named tile encoder
    tile_weights_sha256: tuple[str, ...] = ()

    def as_dict(self) -> JsonObject:
        """JSON-ready (tuples as lists; the tile side as bags store it, `tile_size_um`), for
        `wsi slide-encoders --json`."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in to_stored(asdict(self)).items()}


class SlideEncoder(nn.Module):
    """Base class: `encode(feats (N, D), coords_um (N, 2) | None, tile_um)` -> (dim,) float32."""

    SPEC: ClassVar[SlideEncoderSpec]
    name: str = ""
    weights_sha256: str = "random"

    def encode(
        self, feats: torch.Tensor, coords_um: torch.Tensor | None, tile_um: float
    ) -> torch.Tensor:
        raise NotImplementedError

    def authors_to_ours(self, state: StateDict) -> StateDict:
        """The authors' tensor names -> this module's (identity where they already agree)."""
        return state


SLIDE_ENCODERS: Registry[type[SlideEncoder]] = Registry(
    "slide encoder", modules=tuple(dict.fromkeys(ENCODER_MODULES.values()))
)  # every module of names.py's table, imported on the first lookup


def get_spec(name: str) -> SlideEncoderSpec:
    return SLIDE_ENCODERS.get(name).SPEC


def count_parameters(name: str) -> int:
    """Parameters of the published architecture, built on the meta device (no memory allocated)."""
    with torch.device("meta"):
        model = SLIDE_ENCODERS.get(name)()
    return sum(p.numel() for p in model.parameters())


def streaming_attention_pool(
    scores_of: Callable[[torch.Tensor], torch.Tensor],
    values_of: Callable[[torch.Tensor], torch.Tensor],
    feats: torch.Tensor,
    chunk: int | None = None,
) -> torch.Tensor:
    """sum_i softmax(s)_i v_i over all N tiles, `chunk` tiles at a time (running max, online softmax).

    Exactly the one-pass softmax pooling, but activations never exceed `chunk` rows: a 100,000-tile
    slide costs the memory of 8,192 (ABMIL's hidden layers are ~3x the feature width per tile).
    scores_of(x (n, D)) -> (n,) ; values_of(x (n, D)) -> (n, V).
    """
    if feats.shape[0] == 0:
        raise ValueError("an empty bag has no slide embedding")
    chunk = chunk or CHUNK_TILES  # read now: the benchmark sets it to N to measure one pass
    run_max = torch.tensor(-math.inf, dtype=torch.float64, device=feats.device)
    total = torch.zeros((), dtype=torch.float64, device=feats.device)
    acc: torch.Tensor | None = None
    for start in range(0, feats.shape[0], chunk):
        x = feats[start : start + chunk]
        s = scores_of(x).double()
        v = values_of(x).double()
        new_max = torch.maximum(run_max, s.max())
        scale = torch.exp(run_max - new_max)
        w = torch.exp(s - new_max)
        total = total * scale + w.sum()
        acc = (v * w[:, None]).sum(0) if acc is None else acc * scale + (v * w[:, None]).sum(0)
        run_max = new_max
    assert acc is not None
    return (acc / total).float()


# ------------------------------------------------------------------------------------------- weights
def _few(keys: set[str], n: int = 5) -> str:
    items = sorted(keys)
    return ", ".join(items[:n]) + (f" (+{len(items) - n} more)" if len(items) > n else "")


def resolve_weights_file(path: str | os.PathLike[str], spec: SlideEncoderSpec, name: str) -> Path:
    """The weights file itself, or the first of the authors' file names inside a model folder."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        for candidate in spec.weights_files:
            if (path / candidate).is_file():
                return path / candidate
        raise WeightsError(
            f"model folder {path} has none of {', '.join(spec.weights_files)} for slide encoder {name!r}; "
            "give the weights file itself"
        )
    raise WeightsError(f"weights {path} do not exist; download them from {spec.weights_page}")


def _hub_weights(weights: str | os.PathLike[str] | None, spec: SlideEncoderSpec, name: str) -> Path | None:
    return hub_weights(
        weights, repo=repo_of(spec.weights_page), files=spec.weights_files, what=f"slide encoder {name!r}",
        licence=spec.licence, page=spec.weights_page,
    )  # fmt: skip


def load_checked(model: SlideEncoder, state: StateDict, path: Path, name: str) -> None:
    """Load all of `state` (authors' layout) into `model` or nothing: every key and shape checked first."""
    from wsi.models.encoders.weights import load_all_or_nothing

    load_all_or_nothing(
        model, model.authors_to_ours(state), path=path, what=f"slide encoder {name!r}",
        fit_hint=f"; is it a checkpoint of this model? Its weights come from {model.SPEC.weights_page}",
    )  # fmt: skip


def build_slide_encoder(
    name: str, *, weights: str | os.PathLike[str] | None = None, random_init: bool = False
) -> SlideEncoder:
    """The slide encoder `name` in eval mode, its weights loaded and checked (or random for tests)."""
    from wsi.core.files import sha256_file
    from wsi.models.encoders import load_state_dict_file

    cls = SLIDE_ENCODERS.get(name)
    if weights is not None and not random_init:  # hf:ORG/REPO or a URL: a local file (wsi.storage.hf)
        weights = _hub_weights(weights, cls.SPEC, name)
    elif weights is None and not random_init and repo_of(cls.SPEC.weights_page):
        weights = _hub_weights(None, cls.SPEC, name)  # published on the Hub: from the cache, offline
    if (weights is None) == (not random_init):
        raise ConfigError(
            f"slide encoder {name!r} needs --weights FILE (from {cls.SPEC.weights_page}), "
            "or --random-init for a test run (not both)"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # --random-init: every run (and every dask worker) builds the same network
        model = cls()
    model.name = name
    if weights is not None:
        path = resolve_weights_file(weights, cls.SPEC, name)
        load_checked(model, load_state_dict_file(path), path, name)
        model.weights_sha256 = sha256_file(path)
    else:
        log.warning("slide encoder %s has RANDOM weights (--random-init): its embeddings mean nothing", name)
    return model.requires_grad_(False).eval()  # frozen: embeddings only, no autograd graph


__all__ = [
    "CHUNK_TILES",
    "SLIDE_ENCODERS",
    "SlideEncoder",
    "SlideEncoderSpec",
    "build_slide_encoder",
    "count_parameters",
    "get_spec",
    "load_checked",
    "streaming_attention_pool",
]

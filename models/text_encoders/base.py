"""What every text tower shares: its published facts, the registry, checked weights and the joint space.

A text tower turns prompts into vectors in a vision-language model's joint space, and maps the image
embeddings wsi stores (tile features in bags, slide embeddings) into the same space, with the matrices
of the same checkpoint (CONCH's `proj_contrast`, TITAN's `proj`, PRISM's `img_to_latents`). Each member
is a `TextTower` subclass in its own module with `@TEXT_ENCODERS.register("name")` and a `SPEC`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from wsi.core.errors import ConfigError, WeightsError
from wsi.core.json_types import JsonObject
from wsi.core.registry import Registry
from wsi.models.text_encoders.names import TOWER_MODULES
from wsi.models.text_encoders.text_tokens import Tokenized
from wsi.storage.hf import cached_file, hub_weights, repo_of

log = logging.getLogger("wsi.models.text_encoders")

StateDict = dict[str, torch.Tensor]
#: prompts encoded at once (a class ensemble is 20-100 prompts; TCGA-OT's 46 classes x 23 templates ~ 4,000)
PROMPT_BATCH = 64


@dataclass(frozen=True)
class TextTowerSpec:
    """The published facts of one text tower (what `wsi zero-shot --help` and docs/zero_shot.md list)."""

    level: Literal["tile", "slide"]  # scores tiles of bags, or slide embeddings
    image_encoders: tuple[str, ...]  # tile encoders (tile level) or slide encoders (slide level) it scores
    dim: int  # joint space width
    context_length: int  # token positions the tower reads
    weights_page: str
    weights_files: tuple[str, ...]
    tokenizer_files: str  # where the tokenizer comes from, in words
    templates: tuple[str, ...]  # the authors' prompt templates ("CLASSNAME" is replaced)
    temperature: str  # which tensor scales the logits: "logit_scale", "temperature" or "none" (the authors')
    prompt_pooling: Literal["mean-embedding", "sum-probability"]  # how a class's prompts are combined
    reference: str  # the authors' code (repository, file, commit)
    licence: str

    def as_dict(self) -> JsonObject:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


class TextTower(nn.Module):
    """Base class. Subclasses build the layers and set `tokenizer` via `load_tokenizer`."""

    SPEC: ClassVar[TextTowerSpec]
    name: str = ""
    weights_sha256: str = "random"
    weights_path: Path | None = None  # the checkpoint file (its slide encoder reads the same file)
    tokenizer: Any = None

    # -------------------------------------------------------------------------------- to implement
    def encode_ids(self, tokens: Tokenized) -> torch.Tensor:
        """(P, L) token ids -> (P, dim) text embeddings as the authors' encode_text gives them, not normed."""
        raise NotImplementedError

    def image_to_joint(self, feats: torch.Tensor) -> torch.Tensor:
        """Stored image embeddings (N, d) -> (N, dim) unit vectors in the joint space."""
        raise NotImplementedError

    def image_dim(self) -> int:
        """The width of the stored image embeddings `image_to_joint` maps (a bag's or slide embedding's)."""
        raise NotImplementedError

    def logit_scale(self) -> float:
        """The factor the authors multiply cosine similarities by before the softmax."""
        raise NotImplementedError

    def authors_to_ours(self, state: StateDict) -> StateDict:
        """The authors' checkpoint names -> this module's; tensors of other parts are dropped by name."""
        return state

    def load_tokenizer(self, folder: Path | None, given: Path | None, random_init: bool) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------ shared
    def tokenize(self, prompts: Sequence[str]) -> Tokenized:
        if self.tokenizer is None:
            raise RuntimeError(f"text tower {self.name} has no tokenizer")
        tokens: Tokenized = self.tokenizer(list(prompts))
        vocab = self.vocab_size()
        if int(tokens.ids.max()) >= vocab:
            raise WeightsError(
                f"tokenizer {getattr(self.tokenizer, 'source', '')} gives token ids up to "
                f"{int(tokens.ids.max())}, "
                f"but text tower {self.name} has {vocab} embeddings: is it this model's tokenizer?"
            )
        return tokens

    def vocab_size(self) -> int:
        raise NotImplementedError

    @torch.no_grad()
    def encode_text(self, prompts: Sequence[str], *, normalize: bool = True) -> torch.Tensor:
        """(P, dim) float32 embeddings of the prompts, unit length unless normalize=False. The prompts are
        tokenized together (PRISM pads to the longest of the set, as its authors do), run in batches."""
        if not prompts:
            return torch.zeros(0, self.SPEC.dim)
        tokens = self.tokenize(prompts)
        device = next(self.parameters()).device
        out = []
        for start in range(0, len(prompts), PROMPT_BATCH):
            ids = tokens.ids[start : start + PROMPT_BATCH].to(device)
            out.append(self.encode_ids(Tokenized(ids, tokens.pad_id)).float().cpu())
        emb = torch.cat(out)
        return F.normalize(emb, dim=-1) if normalize else emb


TEXT_ENCODERS: Registry[type[TextTower]] = Registry(
    "text encoder", modules=tuple(dict.fromkeys(TOWER_MODULES.values()))
)  # every module of names.py's table, imported on the first lookup


def get_spec(name: str) -> TextTowerSpec:
    return TEXT_ENCODERS.get(name).SPEC


def load_checked(model: TextTower, state: StateDict, path: Path, name: str) -> None:
    """Load the tower's tensors from the authors' checkpoint or nothing: every key and shape checked."""
    from wsi.models.encoders.weights import load_all_or_nothing

    load_all_or_nothing(
        model, model.authors_to_ours(state), path=path, what=f"text encoder {name!r}",
        fit_hint=f"; is it a checkpoint of this model? Its weights come from {model.SPEC.weights_page}",
    )  # fmt: skip


def _weights_file(weights: str | os.PathLike[str] | None, spec: TextTowerSpec, name: str) -> Path:
    repo = repo_of(spec.weights_page)
    found = hub_weights(
        weights,
        repo=repo,
        files=spec.weights_files,
        what=f"text encoder {name!r}",
        licence=spec.licence,
        page=spec.weights_page,
    )
    path = Path(found) if found is not None else Path(os.fspath(weights)) if weights is not None else None
    if path is None:
        raise ConfigError(
            f"text encoder {name!r} needs --weights (from {spec.weights_page}), or --random-init"
        )
    if path.is_dir():
        for candidate in spec.weights_files:
            if (path / candidate).is_file():
                return path / candidate
        raise WeightsError(
            f"model folder {path} has none of {', '.join(spec.weights_files)} for text encoder {name!r}; "
            "give the weights file itself"
        )
    if not path.is_file():
        raise WeightsError(f"weights {path} do not exist; download them from {spec.weights_page}")
    return path


def hub_file(repo: str, files: Sequence[str]) -> Path | None:
    """A file of a Hugging Face repository from the local cache (None when absent): never downloaded."""
    return cached_file(repo, files)


def build_text_encoder(
    name: str,
    *,
    weights: str | os.PathLike[str] | None = None,
    random_init: bool = False,
    tokenizer: str | os.PathLike[str] | None = None,
    config: Any = None,
) -> TextTower:
    """The text tower `name` in eval mode, its weights and tokenizer loaded (or random weights for tests).

    weights: the authors' checkpoint file or model folder, `hf:ORG/REPO`, or None (the Hugging Face cache);
    tokenizer: a tokenizer file or folder overriding where the tower looks (beside the weights, the cache);
    config: tests only (a smaller architecture of the same code)."""
    from wsi.core.files import sha256_file
    from wsi.models.encoders import load_state_dict_file

    cls = TEXT_ENCODERS.get(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # --random-init: every run builds the same network
        model = cls() if config is None else cls(config)
    model.name = name
    folder: Path | None = None
    if not random_init:
        path = _weights_file(weights, cls.SPEC, name)
        folder = path.parent
        load_checked(model, load_state_dict_file(path), path, name)
        model.weights_sha256 = sha256_file(path)
        model.weights_path = path
    else:
        if weights is not None:
            raise ConfigError(f"text encoder {name!r}: give --weights or --random-init, not both")
        log.warning("text encoder %s has RANDOM weights (--random-init): its scores mean nothing", name)
    model.tokenizer = model.load_tokenizer(
        folder, Path(os.fspath(tokenizer)) if tokenizer else None, random_init
    )
    return model.requires_grad_(False).eval()


__all__ = [
    "PROMPT_BATCH",
    "TEXT_ENCODERS",
    "TextTower",
    "TextTowerSpec",
    "build_text_encoder",
    "get_spec",
    "hub_file",
    "load_checked",
]

"""What `wsi zero-shot` reads: bags of tile features, or slide embeddings (or bags a slide encoder turns
into them), each checked against the text tower before anything is scored.

A tile-level tower (conch-v1, plip) scores the tiles of bags its own image tower made: the bag's encoder
must be the tower's, and its weights the tower's checkpoint (CONCH's image and text towers share one
file), or both random. A slide-level tower (titan, prism) scores slide embeddings of its slide encoder
(`wsi embed-slides`), or bags of that slide encoder's tile encoder, embedded here with the slide encoder
of the same checkpoint. Anything else is refused with the file named and what to do.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from wsi.core.errors import ConfigError
from wsi.core.files import sanitize_slide_id

log = logging.getLogger("wsi.pipelines.zero_shot")

#: what to do with bags of a tile encoder that has no released text tower
NO_TEXT_SIDE = {
    "conch-v1.5": "CONCH v1.5's text tower is not released; score its slides with TITAN (wsi embed-slides "
    "--encoder titan, then --model titan), or embed the tiles with conch-v1",
    "virchow": "Virchow has no text tower; score its slides with PRISM (--model prism)",
}


class InputRefused(ConfigError):
    """An input this tower cannot score (exit 2): the message names the file and the remedy."""


@dataclass(frozen=True)
class Source:
    """One slide's input: a bag (tile features) or a slide embedding file."""

    slide_id: str
    path: Path
    kind: str  # "bag" | "embedding"
    encoder: str  # the bag's tile encoder or the embedding's slide encoder
    weights_sha256: str
    dim: int = 0  # width of the stored vectors (0: not known)


def find_inputs(paths: Iterable[str | os.PathLike[str]]) -> list[Source]:
    """Every .h5 bag or slide embedding under the paths (files or folders, not recursive), sorted by id."""
    files: list[Path] = []
    for given in paths:
        p = Path(given)
        if p.is_dir():
            files += sorted(q for q in p.glob("*.h5") if q.is_file())
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError(
                f"input {p} does not exist; give bags or slide embeddings (.h5) or their folder"
            )
    if not files:
        raise ConfigError(f"no .h5 bags or slide embeddings in {', '.join(map(str, paths))}")
    out: dict[str, Source] = {}
    for f in files:
        src = _describe(f)
        if src.slide_id in out:
            raise ConfigError(f"slide {src.slide_id} is given twice ({out[src.slide_id].path} and {f})")
        out[src.slide_id] = src
    return [out[k] for k in sorted(out)]


def _describe(path: Path) -> Source:
    try:
        with h5py.File(path, "r") as h5:
            attrs = {k: h5.attrs[k] for k in h5.attrs}
            feats = h5.get("feats")
            dim = int(feats.shape[-1]) if isinstance(feats, h5py.Dataset) and feats.ndim >= 1 else 0
    except OSError as exc:
        raise ConfigError(f"{path} is not a readable HDF5 file ({exc})") from None

    def text(key: str) -> str:
        v = attrs.get(key, "")
        return v.decode() if isinstance(v, bytes) else str(v)

    if text("format") == "wsi-slide-embedding" or text("feat_type") in ("slide", "patient"):
        return Source(
            sanitize_slide_id(text("id") or path.stem),
            path,
            "embedding",
            text("slide_encoder"),
            text("slide_encoder_weights_sha256"),
            dim,
        )
    if not text("encoder"):
        raise InputRefused(
            f"{path}: the bag records no encoder (a STAMP, CLAM or TRIDENT bag?); wsi zero-shot needs to "
            "know "
            "its features are the text tower's image side: embed the slides with wsi embed --encoder conch-v1"
        )
    return Source(
        sanitize_slide_id(text("slide_id") or path.stem),
        path,
        "bag",
        text("encoder"),
        text("weights_sha256"),
        dim,
    )


def check_source(
    src: Source,
    *,
    tower_name: str,
    level: str,
    image_encoders: tuple[str, ...],
    tower_sha: str | None,
    tile_encoder_of_slide: str | None,
    image_dim: int = 0,
) -> None:
    """Refuse an input the tower cannot score, naming the file and what to do. tower_sha None and
    image_dim 0 skip the checks that need the built tower (so a wrong bag is named before any weights
    are read); image_dim: the width of the vectors the tower maps into its joint space."""
    allowed = ", ".join(image_encoders)
    if level == "tile":
        if src.kind != "bag":
            raise InputRefused(f"{src.path} is a slide embedding; {tower_name} scores tiles: give its bags")
        if src.encoder not in image_encoders:
            why = NO_TEXT_SIDE.get(
                src.encoder, f"embed the slides with wsi embed --encoder {image_encoders[0]}"
            )
            raise InputRefused(
                f"{src.path} holds {src.encoder} features, but {tower_name}'s text tower scores "
                f"{allowed} features: {why}"
            )
    else:
        if src.kind == "embedding" and src.encoder not in image_encoders:
            raise InputRefused(
                f"{src.path} is a {src.encoder} slide embedding; {tower_name} scores {allowed} slide "
                f"embeddings: wsi embed-slides --encoder {image_encoders[0]}"
            )
        if src.kind == "bag" and src.encoder != tile_encoder_of_slide:
            raise InputRefused(
                f"{src.path} holds {src.encoder} tile features; {tower_name} reads {allowed} slide "
                f"embeddings, made from {tile_encoder_of_slide} bags"
            )
    if src.kind == "bag" and level == "slide":
        return  # the tile encoder's weights are another file; the slide encoder is the tower's checkpoint
    if image_dim and src.dim and src.dim != image_dim:
        what, command = ("features", "embed") if src.kind == "bag" else ("slide embedding", "embed-slides")
        raise InputRefused(
            f"{src.path} holds {src.dim}-d {src.encoder} {what}, but {tower_name}'s text tower maps "
            f"{image_dim}-d ones into its joint space: it was made by another version of {src.encoder}; "
            f"make it again with this wsi (wsi {command} --encoder {src.encoder})"
        )
    random = "random"
    if tower_sha is None:
        return
    if (src.weights_sha256 == random) != (tower_sha == random) or (
        tower_sha != random and src.weights_sha256 != tower_sha
    ):
        raise InputRefused(
            f"{src.path} was made with {src.encoder} weights {src.weights_sha256[:12] or 'unrecorded'}, "
            f"but the text tower's checkpoint is {tower_sha[:12]}: its vectors are not in this tower's joint "
            "space. Give the same weights file to both (wsi embed --weights / wsi zero-shot --weights), or "
            "--random-init to both"
        )


def read_embedding_vector(path: Path) -> np.ndarray:
    from wsi.pipelines.embed_slides import read_embedding

    return np.asarray(read_embedding(path).vector, dtype=np.float32)


__all__ = ["NO_TEXT_SIDE", "InputRefused", "Source", "check_source", "find_inputs", "read_embedding_vector"]

"""`input: slide-embeddings`: one vector per slide (or patient) from `wsi embed-slides`, or STAMP's.

A sample is that vector as a one-row bag (x (1, D), coords (1, 2) zeros), so the bags' collate, the
patient cases (a patient's slides become its rows; the heads average them) and the training loop work
unchanged. `wsi train --features` switches a bag task to this input by itself when the folder holds
slide embeddings (`feat_type` slide or patient), and `predict` refuses embeddings of another slide
encoder or other weights (`check_compatible`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from wsi.core.errors import ConfigError, WsiError
from wsi.core.files import is_temp_name
from wsi.core.json_types import JsonObject, JsonValue
from wsi.formats.slide_embeddings import FEAT_TYPES, read_embedding
from wsi.pipelines.inputs import INPUTS, Batch, DataModelKwargs, Item
from wsi.pipelines.inputs.bag_dataset import collate_bags
from wsi.pipelines.inputs.samples import Sample

log = logging.getLogger(__name__)

#: what must agree between the embeddings a head was trained on and those it predicts on
_KEYS = ("encoder", "slide_encoder_weights_sha256")


def is_embedding_folder(path: Path) -> bool:
    """True when the first .h5 file under `path` says feat_type slide or patient."""
    files = [path] if path.is_file() else sorted(p for p in Path(path).glob("*.h5") if not is_temp_name(p))
    if not files:
        return False
    try:
        with h5py.File(files[0], "r") as h5:
            value = h5.attrs.get("feat_type")
    except OSError:
        return False
    value = value.decode() if isinstance(value, bytes) else value
    return str(value) in FEAT_TYPES


class EmbeddingDataset(Dataset[Sample]):
    def __init__(self, items: Sequence[Item]) -> None:
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Sample:
        item = self.items[index]
        vector = read_embedding(item.path).vector
        return {
            "x": torch.from_numpy(vector)[None],  # (1, D)
            "coords_um": torch.zeros(1, 2),  # no tiles: a placeholder the patient join accepts
            "tile_um": 1.0,
            "label": item.label,
            "id": item.id,
        }


@INPUTS.register("slide-embeddings")
class SlideEmbeddingInput:
    """`input: slide-embeddings` (no options)."""

    name: ClassVar[str] = "slide-embeddings"
    source_option: ClassVar[str] = "--features"

    def find(self, sources: Sequence[Path]) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for source in map(Path, sources):
            files = [source] if source.is_file() else sorted(source.glob("*.h5"))
            files = [p for p in files if not is_temp_name(p)]
            if not files:
                raise ConfigError(
                    f"no slide embeddings (*.h5) in {source}; make them with `wsi embed-slides`"
                )
            for path in files:
                if path.stem in found:
                    raise ConfigError(f"two embeddings for {path.stem!r}: {found[path.stem]} and {path}")
                found[path.stem] = path
        return found

    def bad_items(self, items: Sequence[Item]) -> list[tuple[Item, str]]:
        bad = []
        for item in items:
            try:
                vector = read_embedding(item.path).vector
            except WsiError as exc:
                bad.append((item, str(exc)))
                continue
            if not np.isfinite(vector).all():
                bad.append((item, f"{item.path} holds NaN or infinite values"))
        return bad

    def dataset(self, items: Sequence[Item], *, train: bool) -> Dataset[Sample]:
        return EmbeddingDataset(items)

    def collate(self, samples: list[Sample]) -> Batch:
        return collate_bags(samples)

    def model_kwargs(self, items: Sequence[Item]) -> DataModelKwargs:
        dims: dict[int, str] = {}
        for item in items:
            dims.setdefault(read_embedding(item.path).vector.shape[0], item.path.name)
        if len(dims) > 1:
            listed = "; ".join(f"{d}-d (e.g. {name})" for d, name in sorted(dims.items()))
            raise ConfigError(f"embeddings of different widths cannot train one head: {listed}")
        return {"in_dim": next(iter(dims))}

    def provenance(self, items: Sequence[Item]) -> JsonObject:
        seen: dict[tuple[Any, ...], list[str]] = {}
        first: JsonObject = {}
        for item in items:
            attrs = read_embedding(item.path).attrs
            seen.setdefault(tuple(attrs.get(k) for k in _KEYS), []).append(item.path.name)
            first = first or attrs
        if len(seen) > 1:
            parts = [f"{k[0]} (weights {str(k[1])[:12]}): {len(v)}, e.g. {v[0]}" for k, v in seen.items()]
            raise ConfigError("embeddings were made by different slide encoders: " + "; ".join(parts))
        keys = ("encoder", "slide_encoder_weights_sha256", "tile_encoder", "tile_encoder_weights_sha256",
                "tile_size_um", "target_mpp", "feat_type")  # fmt: skip
        out = {k: _plain(first.get(k)) for k in keys}
        try:
            out["tile_provenance"] = json.loads(str(first.get("tile_provenance") or "{}"))
        except (ValueError, RecursionError):  # not JSON, or nested beyond the parser
            out["tile_provenance"] = {}
        return out

    def check_compatible(self, provenance: Mapping[str, JsonValue], items: Sequence[Item]) -> None:
        want = {k: provenance.get(k) for k in _KEYS}
        bad = []
        for item in items:
            attrs = read_embedding(item.path).attrs
            if any(want[k] is not None and attrs.get(k) != want[k] for k in _KEYS):
                got = (
                    f"{attrs.get('encoder')} (weights {str(attrs.get('slide_encoder_weights_sha256'))[:12]})"
                )
                bad.append(f"{item.path.name}: {got}")
        if bad:
            raise ConfigError(
                f"the head was trained on {want['encoder']} embeddings (weights "
                f"{str(want['slide_encoder_weights_sha256'])[:12]}), but {len(bad)} differ: "
                + "; ".join(bad[:5])
                + ". Embed them with the same slide encoder and weights."
            )


def _plain(value: Any) -> Any:
    """HDF5 attribute -> JSON-able value."""
    if isinstance(value, np.generic):
        return value.item()
    return value

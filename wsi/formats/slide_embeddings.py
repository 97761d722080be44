"""Slide (and patient) embedding files: one HDF5 file per slide or patient, in STAMP's layout.

`OUT/<encoder>-slide/<slide_id>.h5` (patients: `OUT/<encoder>-pat/<patient_id>.h5`) holds `feats`, one
float32 vector (D,), and the root attributes STAMP writes and reads (KatherLab/STAMP c54ce06
src/stamp/encoding/encoder/__init__.py `_save_features_`: `encoder`, `precision`, `feat_type` "slide" |
"patient"; src/stamp/modeling/data.py `detect_feature_type` reads `feat_type`, and `PatientFeatureDataset`
reads `feats` as (D,) or (1, D)), so STAMP's slide-level training reads our folders as its own. Our
provenance rides along as further attributes (`EmbeddingProvenance`): the slide and tile encoders, both
weights digests, the tile size and resolution, and the bags it was made from.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import h5py
import numpy as np

from wsi.core.errors import BagFormatError
from wsi.core.files import atomic_path
from wsi.core.json_types import JsonObject
from wsi.formats.hdf5 import attrs_of, to_stored

FORMAT = "wsi-slide-embedding"
FORMAT_VERSION = 1
FEAT_TYPES = ("slide", "patient")


def _wsi_version() -> str:
    from wsi.core.version import __version__

    return __version__


@dataclass(frozen=True)
class EmbeddingProvenance:
    """How one embedding was made; one root attribute per field (lists as JSON)."""

    id: str  # slide id (feat_type slide) or patient id (feat_type patient)
    feat_type: str  # "slide" | "patient"
    slide_encoder: str
    slide_encoder_weights_sha256: str  # "random" for --random-init
    tile_encoder: str
    tile_encoder_weights_sha256: str  # "" when the bag did not record it (STAMP bags)
    tile_um: float
    target_mpp: float  # um/px of the tiles (0 when the bag did not record it)
    n_tiles: int
    source_bags: tuple[str, ...]  # the tile-feature bags it was made from
    slides: tuple[str, ...] = ()  # patient embeddings: the slide ids, in order
    patient_fusion: str = ""  # patient embeddings: "early" (tiles pooled) | "late" (embeddings averaged)
    #: how the tile features were made (the first bag's encoder, weights, tile_params, precision,
    #: input_px, stain_norm): what `wsi predict` needs to make them again from raw slides; {} if unknown
    tile_provenance: JsonObject = field(default_factory=dict)
    wsi_version: str = field(default_factory=_wsi_version)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def attrs(self) -> dict[str, str | int | float]:
        """The root attributes (lists and the tile provenance as JSON text)."""
        out = to_stored(asdict(self))
        for key in ("source_bags", "slides"):
            out[key] = json.dumps(list(out[key]))
        out["tile_provenance"] = json.dumps(out["tile_provenance"])
        return out


def embedding_dir(out: str | os.PathLike[str], encoder: str, level: str) -> Path:
    """STAMP's folder name: `<encoder>-slide` or `<encoder>-pat` (encode_slides_ / encode_patients_)."""
    return Path(out) / f"{encoder}-{'pat' if level == 'patient' else 'slide'}"


def write_embedding(path: str | os.PathLike[str], vector: np.ndarray, prov: EmbeddingProvenance) -> Path:
    """Write atomically; refuses a non-finite vector (nothing is written)."""
    vector = np.asarray(vector, dtype=np.float32)
    if vector.ndim != 1 or not vector.size:
        raise ValueError(f"a slide embedding is one vector, got shape {vector.shape}")
    if not np.isfinite(vector).all():
        raise BagFormatError(
            f"the {prov.feat_type} embedding of {prov.id} has NaN or infinite values "
            f"(from {', '.join(prov.source_bags)}); check those bags with `wsi bags check`"
        )
    final = Path(path)
    with atomic_path(final) as tmp, h5py.File(tmp, "w") as h5:
        h5.create_dataset("feats", data=vector)
        attrs = {
            **prov.attrs(),
            "encoder": prov.slide_encoder,  # STAMP: the slide encoder's identifier
            "precision": "torch.float32",  # STAMP writes str(torch dtype)
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
        }
        for key, value in attrs.items():
            h5.attrs[key] = value
    return final


@dataclass(frozen=True)
class Embedding:
    vector: np.ndarray  # (D,) float32
    attrs: JsonObject  # every root attribute, as plain Python (STAMP's files carry others)
    path: Path


def read_embedding(path: str | os.PathLike[str]) -> Embedding:
    """Ours or STAMP's slide/patient embedding file; BagFormatError naming the file otherwise."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as h5:
            attrs = attrs_of(h5)
            if "feats" not in h5:
                raise BagFormatError(f"{path} has no `feats` dataset: not a slide embedding file")
            feats = np.asarray(h5["feats"][()], dtype=np.float32)
    except OSError as exc:
        raise BagFormatError(f"{path} is not a readable HDF5 file ({exc})") from None
    if feats.ndim == 2 and feats.shape[0] == 1:
        feats = feats[0]
    if feats.ndim != 1:
        raise BagFormatError(
            f"{path} holds features of shape {feats.shape}, not one vector: it is a bag of tile features; "
            "make slide embeddings with `wsi embed-slides` first"
        )
    if str(attrs.get("feat_type", "")) not in FEAT_TYPES:
        raise BagFormatError(f"{path} has feat_type {attrs.get('feat_type')!r}, not 'slide' or 'patient'")
    return Embedding(feats, attrs, path)

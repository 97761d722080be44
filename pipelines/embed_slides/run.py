"""`wsi embed-slides`: every bag of tile features -> one slide (or patient) embedding file.

Each slide (or patient) is one job: a bag that does not fit the slide encoder (another tile encoder,
other weights, another tile size) or cannot be read fails alone with its reason in the manifest; the
others go on. A file that exists with the same slide encoder and weights is skipped (--overwrite redoes).
Memory: the bag is held as stored (float16 or float32) and the encoder scores it `CHUNK_TILES` rows at
a time, so a 100,000-tile slide costs its features plus one chunk of activations.
"""

from __future__ import annotations

import csv
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from wsi.core.config import with_settings
from wsi.core.errors import ConfigError, LabelError
from wsi.core.files import is_temp_name
from wsi.formats.bags import Bag, no_bags_message, read_bag
from wsi.formats.hdf5 import to_stored
from wsi.formats.slide_embeddings import EmbeddingProvenance, embedding_dir, write_embedding
from wsi.models.slide_encoders import SlideEncoder, build_slide_encoder
from wsi.pipelines.embed_slides.checks import TileSource, check_bag, check_folder
from wsi.pipelines.embed_slides.config import SlideEmbedOptions
from wsi.pipelines.scheduling.jobs import run_jobs, write_manifest
from wsi.pipelines.scheduling.remote import remote_edges
from wsi.pipelines.scheduling.results import JobResult, StageResult

log = logging.getLogger(__name__)

#: the bag provenance fields `wsi predict` needs to make the tile features of raw slides again (stored
#: under the bag's attribute names)
_TILE_KEYS = ("encoder", "weights_sha256", "tile_params", "precision", "input_px", "stain_norm",
              "tile_um", "tile_px")  # fmt: skip


@dataclass(frozen=True)
class EmbedJob:
    """One output file: a slide's bag, or a patient's bags (in slide order)."""

    slide_id: str  # the output's id (slide or patient)
    path: Path  # the first bag (what the manifest shows)
    bags: tuple[Path, ...]


def find_bags(features: Path) -> dict[str, Path]:
    """Slide id -> bag, from a folder of bags (or one bag)."""
    if features.is_file():
        return {features.stem: features}
    bags = {p.stem: p for p in sorted(features.glob("*.h5")) if not is_temp_name(p)}
    if not bags:
        raise ConfigError(no_bags_message(features))
    return bags


def patient_jobs(bags: dict[str, Path], table: Path) -> list[EmbedJob]:
    """One job per patient of a CSV with `patient` and `slide` columns (slide: id or bag file name)."""
    try:
        with table.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise LabelError(f"cannot read the slide table {table} ({exc.strerror})") from None
    if not rows or not {"patient", "slide"} <= set(rows[0]):
        raise LabelError(f"{table} needs a `patient` and a `slide` column (one row per slide)")
    by_patient: dict[str, list[Path]] = {}
    missing: list[str] = []
    for row in rows:
        slide = Path(row["slide"].strip()).name.removesuffix(".h5")
        if slide not in bags:
            missing.append(slide)
            continue
        by_patient.setdefault(row["patient"].strip(), []).append(bags[slide])
    if missing:
        log.warning("%d slides of %s have no bag (e.g. %s); left out", len(missing), table, missing[0])
    if not by_patient:
        raise LabelError(f"no slide of {table} has a bag among the {len(bags)} given")
    return [EmbedJob(p, paths[0], tuple(paths)) for p, paths in sorted(by_patient.items())]


class _Embedder:
    """The batch function: the encoder is built once and kept (inline jobs)."""

    def __init__(self, model: SlideEncoder, out_dir: Path, level: str, overwrite: bool, device: torch.device):
        self.model, self.out_dir, self.level, self.overwrite, self.device = (
            model,
            out_dir,
            level,
            overwrite,
            device,
        )

    def _done(self, path: Path) -> bool:
        if self.overwrite or not path.is_file():
            return False
        try:
            with h5py.File(path, "r") as h5:
                return bool(
                    h5.attrs.get("slide_encoder") == self.model.name
                    and h5.attrs.get("slide_encoder_weights_sha256") == self.model.weights_sha256
                )
        except OSError:
            return False

    def _one(self, bag_path: Path) -> tuple[torch.Tensor, int, dict[str, object]]:
        spec = self.model.SPEC
        bag = read_bag(bag_path, require_um=spec.uses_positions)
        source = check_bag(bag, spec, self.model.name)
        if len(bag) == 0:
            raise ConfigError(f"{bag_path} holds no tiles: nothing to embed")
        if bag.dim != spec.in_dim:
            raise ConfigError(
                f"{bag_path} holds {bag.dim}-d features; {self.model.name} reads {spec.in_dim}-d"
            )
        feats = torch.from_numpy(bag.feats).to(self.device)
        coords = None if bag.coords_um is None else torch.from_numpy(bag.coords_um).to(self.device)
        with torch.inference_mode():
            z = self.model.encode(feats, coords, float(bag.tile_um or spec.tile_um))
        return z.cpu(), len(bag), _facts(bag, source)

    def __call__(self, job: EmbedJob) -> JobResult:
        out = self.out_dir / f"{job.slide_id}.h5"
        if self._done(out):
            return JobResult(job.slide_id, str(job.path), "skipped")
        start = time.perf_counter()
        spec = self.model.SPEC
        if self.level == "patient" and spec.patient_fusion == "early" and len(job.bags) > 1:
            z, n, facts = self._pooled(job.bags)
        else:
            parts = [self._one(p) for p in job.bags]  # late fusion: the mean of the slide embeddings
            z = torch.stack([p[0] for p in parts]).mean(0)
            n, facts = sum(p[1] for p in parts), parts[0][2]
        prov = EmbeddingProvenance(
            id=job.slide_id, feat_type=self.level, slide_encoder=self.model.name,
            slide_encoder_weights_sha256=self.model.weights_sha256, tile_encoder=str(facts["tile_encoder"]),
            tile_encoder_weights_sha256=str(facts["tile_sha"]), tile_um=float(facts["tile_size_um"]),  # type: ignore[arg-type]
            target_mpp=float(facts["target_mpp"]), n_tiles=n, source_bags=tuple(str(p) for p in job.bags),  # type: ignore[arg-type]
            slides=tuple(p.stem for p in job.bags) if self.level == "patient" else (),
            patient_fusion=spec.patient_fusion if self.level == "patient" else "",
            tile_provenance=dict(facts["tile_provenance"]),  # type: ignore[call-overload]
        )  # fmt: skip
        write_embedding(out, z.numpy(), prov)
        return JobResult(job.slide_id, str(job.path), "ok", n=n, seconds=time.perf_counter() - start)

    def _pooled(self, bags: Sequence[Path]) -> tuple[torch.Tensor, int, dict[str, object]]:
        """Early fusion: the patient's tiles as one bag (only for encoders without positions)."""
        spec = self.model.SPEC
        loaded = [read_bag(p, require_um=False) for p in bags]
        sources = [check_bag(b, spec, self.model.name) for b in loaded]
        feats = torch.from_numpy(np.concatenate([b.feats for b in loaded])).to(self.device)
        with torch.inference_mode():
            z = self.model.encode(feats, None, spec.tile_um)
        return z.cpu(), int(feats.shape[0]), _facts(loaded[0], sources[0])


def _facts(bag: Bag, source: TileSource) -> dict[str, object]:
    prov = bag.provenance
    tile_prov: dict[str, object] = {}
    if prov is not None:  # ours: enough to tile and embed raw slides the same way again
        tile_prov = to_stored({k: getattr(prov, k) for k in _TILE_KEYS if getattr(prov, k) is not None})
    return {
        "tile_encoder": source.encoder,
        "tile_sha": source.weights_sha256 or "",
        "tile_size_um": float(bag.tile_um or 0.0),
        "target_mpp": float(prov.target_mpp or 0.0) if prov else 0.0,
        "tile_provenance": tile_prov,
    }


@dataclass(frozen=True)
class SlideEmbedResult(StageResult[JobResult]):
    """One row per slide (or patient), and `folder`: OUT/<encoder>-slide (or -pat), the embeddings."""

    folder: Path = field(default=Path(), kw_only=True)


def embed_slides(
    features_dir: str | Path,
    *,
    out_dir: str | Path,
    options: SlideEmbedOptions | None = None,
    **settings: Any,
) -> SlideEmbedResult:
    """Embed every bag under `features_dir` (or every patient of `options.slide_table`) into
    `out_dir/<encoder>-slide/` (`-pat/`), with manifest.csv; one row per slide or patient (failed ones
    carry the reason). `options` (or its fields as keywords, `settings`): `SlideEmbedOptions`. Both
    folders and the slide table may be URLs (`pipelines.scheduling.remote`)."""
    opts = with_settings(SlideEmbedOptions, options, settings, source="embed-slides options")
    start = time.perf_counter()
    folder, rows = _embed_slides(
        features=features_dir, out=out_dir, slide_table=opts.slide_table, options=opts
    )
    seconds = time.perf_counter() - start
    return SlideEmbedResult(
        "embed-slides", out_dir, tuple(rows), seconds, folder=folder, manifest=folder / "manifest.csv"
    )


@remote_edges(out="out", folders={"features": "--features folder"}, files={"slide_table": "slide table"})
def _embed_slides(
    *, features: str | Path, out: str | Path, slide_table: Any, options: SlideEmbedOptions
) -> tuple[Path, list[JobResult]]:
    from wsi.pipelines.scheduling.devices import resolve_device

    opts = options
    model = build_slide_encoder(opts.encoder, weights=opts.weights, random_init=opts.random_init)
    dev = resolve_device(opts.device)
    model.to(dev)
    bags = find_bags(Path(features))
    check_folder(bags, model.SPEC, model.name, Path(features))  # a wrong folder: one line, exit 2
    if opts.level == "patient":
        jobs = patient_jobs(bags, Path(str(slide_table)))
    else:
        jobs = [EmbedJob(sid, p, (p,)) for sid, p in bags.items()]
    out_dir = embedding_dir(out, opts.encoder, opts.level)
    out_dir.mkdir(parents=True, exist_ok=True)
    embedder = _Embedder(model, out_dir, opts.level, opts.overwrite, dev)
    results = run_jobs(jobs, embedder, desc=f"{opts.level}s", unit="tiles")
    write_manifest(out_dir / "manifest.csv", results)
    return out_dir, results

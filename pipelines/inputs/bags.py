"""The bag input stage: feature bags (ours, STAMP, CLAM, TRIDENT) -> padded batches for vit-wsi.

Bags are read only through `wsi.bags.load_bag`, so every layout looks the same here. Whole bags are
the default; `bag_size` turns on random subsampling of at most that many tiles per training bag
(STAMP-style augmentation; validation, test and prediction always see every tile).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.utils.data import Dataset

from pipelines.inputs import INPUTS, Batch, Item
from wsi.bags import bag_length, load_bag, read_bag_attrs, read_bag_header
from wsi.errors import ConfigError, WsiError
from wsi.files import is_temp_name
from wsi.suffixes import BAG_SUFFIX

log = logging.getLogger(__name__)

#: bag attributes that must agree between the bags a model was trained on and those it predicts on
_ENCODER_KEYS = ("encoder", "weights_sha256")


class BagDataset(Dataset[dict[str, Any]]):
    """Sample i = one bag: {"x": (N, D), "coords_um": (N, 2), "label": int, "id": str}."""

    def __init__(self, items: Sequence[Item], *, bag_size: int | None, mpp: float | None = None) -> None:
        self.items = list(items)
        self.bag_size = bag_size
        self.mpp = mpp

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.items[index]
        rows = None
        if self.bag_size is not None:
            n = bag_length(item.path)
            if n > self.bag_size:
                # torch's RNG: seeded per epoch by the loop (and per worker by the DataLoader).
                rows = torch.randperm(n)[: self.bag_size].sort().values.numpy()
        bag = load_bag(item.path, mpp=self.mpp, rows=rows)
        return {
            "x": torch.from_numpy(bag.feats),  # (N, D) float16|float32 as stored; cast on the device
            "coords_um": torch.from_numpy(bag.coords_um),  # (N, 2)
            "label": item.label,
            "id": item.id,
        }


def collate_bags(samples: list[dict[str, Any]]) -> Batch:
    """Pad to the longest bag; `mask` (B, N) is True on real tiles and is left out when none is padded."""
    lengths = [s["x"].shape[0] for s in samples]
    n_max, dim = max(lengths), samples[0]["x"].shape[1]
    labels = torch.tensor([s["label"] for s in samples], dtype=torch.long)
    ids = [s["id"] for s in samples]
    if len(samples) == 1:  # the usual case (whole bags, batch 1): views, no copy
        s = samples[0]
        return Batch(x=s["x"][None], labels=labels, ids=ids, extra={"coords_um": s["coords_um"][None]})
    if all(n == n_max for n in lengths):
        x = torch.stack([s["x"] for s in samples])  # (B, N, D)
        coords = torch.stack([s["coords_um"] for s in samples])  # (B, N, 2)
        return Batch(x=x, labels=labels, ids=ids, extra={"coords_um": coords})
    x = samples[0]["x"].new_zeros((len(samples), n_max, dim))  # (B, N_max, D)
    coords = torch.zeros((len(samples), n_max, 2), dtype=torch.float32)
    mask = torch.zeros((len(samples), n_max), dtype=torch.bool)
    for i, (s, n) in enumerate(zip(samples, lengths, strict=True)):
        x[i, :n] = s["x"]
        coords[i, :n] = s["coords_um"]
        mask[i, :n] = True
    return Batch(x=x, labels=labels, ids=ids, extra={"mask": mask, "coords_um": coords})


@INPUTS.register("bags")
class BagInput:
    """`input: bags`. Options (task YAML `input_options`):

    bag_size: at most this many randomly chosen tiles per training bag (None = whole bags, default).
    mpp: level-0 um/px for CLAM/TRIDENT bags that store pixel coordinates and no `mpp` attribute.
    """

    name: ClassVar[str] = "bags"
    source_option: ClassVar[str] = "--features"

    def __init__(self, *, bag_size: int | None = None, mpp: float | None = None) -> None:
        if bag_size is not None and (not isinstance(bag_size, int) or bag_size < 1):
            raise ConfigError(f"input_options.bag_size must be a positive integer or null, not {bag_size!r}")
        self.bag_size = bag_size
        self.mpp = mpp

    def find(self, sources: Sequence[Path]) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for source in map(Path, sources):
            if source.is_dir():
                files = sorted(p for p in source.glob(f"*{BAG_SUFFIX}") if not is_temp_name(p))
                if not files:
                    raise ConfigError(
                        f"no feature bags (*.h5) in {source}; give the folder `wsi embed` wrote, "
                        "e.g. RUN/features/<encoder>"
                    )
            elif source.is_file() and source.suffix == BAG_SUFFIX:
                files = [source]
            else:
                raise ConfigError(f"{source} is neither a folder of bags nor an .h5 bag")
            for path in files:
                slide_id = path.stem
                if slide_id in found and found[slide_id] != path:
                    raise ConfigError(f"two bags for slide {slide_id!r}: {found[slide_id]} and {path}")
                found[slide_id] = path
        return found

    def dataset(self, items: Sequence[Item], *, train: bool) -> Dataset[dict[str, Any]]:
        return BagDataset(items, bag_size=self.bag_size if train else None, mpp=self.mpp)

    def collate(self, samples: list[dict[str, Any]]) -> Batch:
        return collate_bags(samples)

    def model_kwargs(self, items: Sequence[Item]) -> dict[str, Any]:
        dims: dict[int, str] = {}
        for item in items:
            dims.setdefault(read_bag_header(item.path).dim, item.path.name)
        if len(dims) > 1:
            listed = "; ".join(f"{d}-d (e.g. {name})" for d, name in sorted(dims.items()))
            raise ConfigError(f"bags of different feature widths cannot train one model: {listed}")
        return {"in_dim": next(iter(dims))}

    def provenance(self, items: Sequence[Item]) -> dict[str, Any]:
        """How the features were made (from the bags' attributes), so predict can make them again."""
        seen: dict[tuple[Any, ...], list[str]] = {}
        first: dict[str, Any] = {}
        for item in items:
            attrs = read_bag_attrs(item.path)
            key = tuple(attrs.get(k) for k in _ENCODER_KEYS)
            seen.setdefault(key, []).append(item.path.name)
            if not first:
                first = attrs
        if len(seen) > 1:
            parts = [
                f"{k[0]} (weights {str(k[1])[:12]}): {len(v)} bags, e.g. {v[0]}" for k, v in seen.items()
            ]
            raise ConfigError("bags were made by different encoders: " + "; ".join(parts))
        tile_params = first.get("tile_params")
        if isinstance(tile_params, str):
            with contextlib.suppress(json.JSONDecodeError):
                tile_params = json.loads(tile_params)
        return {
            "encoder": first.get("encoder"),
            "weights_sha256": first.get("weights_sha256"),
            "tile_size_um": first.get("tile_size_um"),
            "tile_size_px": first.get("tile_size_px"),
            "tile_params": tile_params,
            "target_mpp": first.get("target_mpp"),
            "input_px": first.get("input_px"),
            "precision": first.get("precision"),
            "feature_dim": read_bag_header(items[0].path).dim,
            "bag_format": first.get("format"),
        }

    def check_compatible(self, provenance: Mapping[str, Any], items: Sequence[Item]) -> None:
        """Refuse bags from another encoder or weights than the model was trained on."""
        want = {k: provenance.get(k) for k in _ENCODER_KEYS}
        dim = provenance.get("feature_dim")
        bad: list[str] = []
        unverified = 0
        for item in items:
            try:
                header = read_bag_header(item.path)
                attrs, item_dim = header.attrs, header.dim
            except WsiError:
                continue  # unreadable: that one item fails on its own later, the batch goes on
            if dim is not None and item_dim != dim:
                bad.append(f"{item.path.name} has {item_dim}-d features, the model {dim}-d")
                continue
            if any(want[k] is None or attrs.get(k) is None for k in _ENCODER_KEYS):
                unverified += 1
                continue
            diff = [f"{k} {attrs[k]!s:.16} != {want[k]!s:.16}" for k in _ENCODER_KEYS if attrs[k] != want[k]]
            if diff:
                bad.append(f"{item.path.name}: {', '.join(diff)}")
        if bad:
            raise ConfigError(
                f"the model was trained on features from encoder {want['encoder']} (weights sha256 "
                f"{str(want['weights_sha256'])[:16]}), but {len(bad)} bag(s) differ: "
                + "; ".join(bad[:5])
                + ("; ..." if len(bad) > 5 else "")
                + ". Embed the slides with the model's encoder and weights, or predict from raw slides."
            )
        if unverified:
            log.warning("%d bag(s) record no encoder/weights; cannot verify they match the model", unverified)

    def heatmap(
        self,
        item: Item,
        sample: Mapping[str, Any],
        contributions: torch.Tensor,
        out_png: Path,
        title: str = "",
    ) -> None:
        """Per-tile values (N,) drawn at the tile coordinates on a blank canvas (no slide here)."""
        from pipelines.heatmaps import render_heatmap

        bag_attrs = read_bag_attrs(item.path)
        tile_size_um = bag_attrs.get("tile_size_um")
        coords = sample["coords_um"].numpy()
        if tile_size_um is None:  # other layouts: infer the grid step from the coordinates
            tile_size_um = load_bag(item.path, mpp=self.mpp, rows=slice(0, 1)).tile_size_um
        render_heatmap(
            coords_um=coords,
            tile_size_um=float(tile_size_um or 1.0),
            values=contributions.float().numpy(),
            out_png=out_png,
            title=title,
        )

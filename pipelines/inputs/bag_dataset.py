"""The torch Dataset of feature bags and their collation: one bag a sample, padded batches with a mask.

Bags are read through `wsi.formats.bags.read_bag` (ours, STAMP, CLAM, TRIDENT look the same here); a
training bag may be subsampled to `bag_size` tiles (validation, test and prediction see every tile).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from wsi.formats.bags import bag_length, check_finite, read_bag
from wsi.pipelines.inputs import Batch, Item
from wsi.pipelines.inputs.samples import Sample


class BagDataset(Dataset[Sample]):
    """Sample i = one bag: {"x": (N, D), "coords_um": (N, 2), "label": int, "id": str, "tile_um"}.

    A pixel-layout bag of unknown resolution (allowed only when `uses_positions` is False) gives
    "coords_px" (N, 2) and "tile_px0" instead of "coords_um" and "tile_um".
    """

    def __init__(
        self,
        items: Sequence[Item],
        *,
        bag_size: int | None,
        mpp: float | None = None,
        mpp_by_slide: Mapping[str, float] | None = None,
        uses_positions: bool = True,
    ) -> None:
        self.items = list(items)
        self.bag_size = bag_size
        self.mpp = mpp
        self.mpp_by_slide = dict(mpp_by_slide or {})
        self.uses_positions = uses_positions
        self.cache: list[Sample] | None = None  # every sample, once preload() kept them

    def __len__(self) -> int:
        return len(self.items)

    def mpp_for(self, item: Item) -> float | None:
        """The slide's level-0 um/px given from outside: its own (CSV column), else the run-wide one."""
        return self.mpp_by_slide.get(item.id, self.mpp)

    def preload(self, limit_bytes: int) -> bool:
        """Read every bag once and keep it in memory when their files hold at most `limit_bytes` (a
        small cohort: no HDF5 re-read per epoch; training subsamples in memory with the same RNG draw
        as from disk). False, and nothing read, for larger cohorts: they stay streamed from disk."""
        if self.cache is not None:
            return True
        if sum(Path(item.path).stat().st_size for item in self.items) > limit_bytes:
            return False
        self.cache = [self._read(item, None) for item in self.items]
        return True

    def __getitem__(self, index: int) -> Sample:
        item = self.items[index]
        if self.cache is not None:
            sample = self.cache[index]
            n = sample["x"].shape[0]
            if self.bag_size is None or n <= self.bag_size:
                return sample.copy()
            keep = torch.randperm(n)[: self.bag_size].sort().values  # the draw __getitem__ makes from disk
            return _rows(sample, keep)
        rows = None
        if self.bag_size is not None:
            n = bag_length(item.path)
            if n > self.bag_size:
                # torch's RNG: seeded per epoch by the loop (and per worker by the DataLoader).
                rows = torch.randperm(n)[: self.bag_size].sort().values.numpy()
        return self._read(item, rows)

    def _read(self, item: Item, rows: Any) -> Sample:
        bag = read_bag(item.path, mpp=self.mpp_for(item), rows=rows, require_um=self.uses_positions)
        check_finite(bag)  # NonFiniteFeaturesError naming the bag: never train or predict on NaN
        sample: Sample = {
            "x": torch.from_numpy(bag.feats),  # (N, D) float16|float32 as stored; cast on the device
            "label": item.label,
            "id": item.id,
        }
        if bag.coords_um is not None:
            sample["coords_um"] = torch.from_numpy(bag.coords_um)  # (N, 2)
            sample["tile_um"] = bag.tile_um
        elif bag.coords_px is not None:  # positions unused by the model: only heatmaps draw them
            sample["coords_px"] = torch.from_numpy(bag.coords_px)  # (N, 2) level-0 px
            sample["tile_px0"] = bag.tile_px0
        return sample


def _rows(sample: Sample, keep: torch.Tensor) -> Sample:
    """The sample's tiles at `keep`: the entries with one row per tile (features, positions) indexed."""
    out = sample.copy()
    out["x"] = sample["x"][keep]
    if "coords_um" in sample:
        out["coords_um"] = sample["coords_um"][keep]
    if "coords_px" in sample:
        out["coords_px"] = sample["coords_px"][keep]
    return out


def collate_bags(samples: list[Sample]) -> Batch:
    """Pad to the longest bag; `mask` (B, N) is True on real tiles and is left out when none is padded."""
    lengths = [s["x"].shape[0] for s in samples]
    n_max, dim = max(lengths), samples[0]["x"].shape[1]
    labels = torch.tensor([s["label"] for s in samples], dtype=torch.long)
    ids = [s["id"] for s in samples]
    # micrometres only when every bag has them (a model without positions may get bags in pixels)
    with_um = all("coords_um" in s for s in samples)
    if len(samples) == 1:  # the usual case (whole bags, batch 1): views, no copy
        s = samples[0]
        coords_um = s["coords_um"][None] if with_um else None
        return Batch(x=s["x"][None], labels=labels, ids=ids, coords_um=coords_um)
    if all(n == n_max for n in lengths):
        x = torch.stack([s["x"] for s in samples])  # (B, N, D)
        coords_um = torch.stack([s["coords_um"] for s in samples]) if with_um else None  # (B, N, 2)
        return Batch(x=x, labels=labels, ids=ids, coords_um=coords_um)
    x = samples[0]["x"].new_zeros((len(samples), n_max, dim))  # (B, N_max, D)
    coords = torch.zeros((len(samples), n_max, 2), dtype=torch.float32)
    mask = torch.zeros((len(samples), n_max), dtype=torch.bool)
    for i, (s, n) in enumerate(zip(samples, lengths, strict=True)):
        x[i, :n] = s["x"]
        if with_um:
            coords[i, :n] = s["coords_um"]
        mask[i, :n] = True
    return Batch(x=x, labels=labels, ids=ids, mask=mask, coords_um=coords if with_um else None)

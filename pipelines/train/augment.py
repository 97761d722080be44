"""Training-only augmentation of feature bags: random tile subsets and input feature dropout.

The loop applies `BagAugment` to each training batch, on the device, just before the model sees it;
validation, test and prediction batches never pass through it (whole bags, every feature). A random
subset of a bag's tiles is a new bag with the same label (the label of a slide does not hinge on every
tile), the MIL counterpart of a random crop; peers subsample too (STAMP's `bag_size`, CLAM's and
TransMIL's training bags), here by a random share rather than a fixed count so that small and large
bags are both thinned. Random numbers come from torch's global generators, which the loop seeds and
saves with the resume state: the same seed gives the same subsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from wsi.pipelines.inputs import Batch
from wsi.pipelines.study.tasks import TaskConfig

#: a subset keeps at least this many tiles: a bag of a handful of tiles whose label rests on one of
#: them would lose it to a random share (label noise), so bags of up to this many stay whole
MIN_SUBSET_TILES = 16


def tile_subset(batch: Batch, fraction: tuple[float, float]) -> Batch:
    """Each bag of `batch` (x: (B, N, D)) keeps a random share in [lo, hi] of its real tiles, but at
    least MIN_SUBSET_TILES of them (all of a smaller bag), in their original order; tensors in `extra`
    with one entry per tile (mask, coords_um) follow.

    A batch with several bags comes back padded to its longest subset with a bool mask (True = real).
    """
    lo, hi = fraction
    x = batch.x
    b, n = x.shape[:2]
    if n == 0 or lo >= 1.0:
        return batch
    mask = batch.mask
    real = torch.ones(b, n, dtype=torch.bool) if mask is None else (mask.detach().cpu() != 0)
    counts = real.sum(1)  # (B,) real tiles per bag
    shares = lo + (hi - lo) * torch.rand(b)  # (B,) drawn on the CPU generator
    keep_n = torch.clamp(torch.round(shares * counts).long(), min=MIN_SUBSET_TILES)
    keep_n = torch.minimum(keep_n, counts)  # a small bag stays whole, an empty one empty
    if bool((keep_n == counts).all()):
        return batch  # nothing to drop (and no random draw changes what the batch holds)
    rows = []
    for i in range(b):
        idx = torch.nonzero(real[i]).squeeze(1)  # (n_i,) positions of real tiles
        pick = idx[torch.randperm(len(idx))[: int(keep_n[i])]].sort().values  # raster order kept
        rows.append(pick)
    width = max(1, int(keep_n.max()))
    index = torch.zeros(b, width, dtype=torch.long)  # (B, K) positions into the old bag
    new_mask = torch.zeros(b, width, dtype=torch.bool)
    for i, pick in enumerate(rows):
        index[i, : len(pick)] = pick
        new_mask[i, : len(pick)] = True
    index = index.to(x.device)

    def take(t: torch.Tensor) -> torch.Tensor:
        gather = index.view(b, width, *([1] * (t.ndim - 2))).expand(b, width, *t.shape[2:])
        return torch.gather(t, 1, gather)  # (B, K, ...)

    coords_um = None if batch.coords_um is None else take(batch.coords_um)
    x_new = take(x)
    kept_mask = None  # every kept position is real
    if b > 1 and not bool(new_mask.all()):
        x_new = x_new.masked_fill(~new_mask.to(x.device)[..., None], 0.0)
        kept_mask = new_mask.to(x.device)
    return Batch(
        x=x_new, labels=batch.labels, ids=batch.ids, mask=kept_mask, coords_um=coords_um,
        targets=batch.targets,
    )  # fmt: skip


def centred_dropout(x: torch.Tensor, p: float, center: torch.Tensor) -> torch.Tensor:
    """Inverted dropout of each feature's deviation from `center` (D,): a dropped feature becomes its
    centre, a kept one center + (x - center) / (1 - p). With the model's standardisation mean as the
    centre this is plain inverted dropout of the z-scores the model sees (zeroing a raw feature would
    hand it -mean/sd, far outside the training range for a feature far from 0)."""
    center = center.to(device=x.device, dtype=x.dtype)
    return center + F.dropout(x - center, p, training=True)


@dataclass(frozen=True)
class BagAugment:
    """What happens to a training batch of feature bags before the model sees it."""

    tile_fraction: tuple[float, float] = (1.0, 1.0)  # share of each bag's tiles kept
    feature_dropout: float = 0.0  # chance each input feature is zeroed (inverted dropout)
    # (D,) what a dropped feature becomes: the model's input standardisation mean, so that dropout acts
    # on z-scores; None: 0
    center: torch.Tensor | None = field(default=None, compare=False)

    @classmethod
    def of(cls, task: TaskConfig, center: torch.Tensor | None = None) -> BagAugment | None:
        """The task's augmentation, or None when it changes nothing or the input is not feature bags.
        `center`: the mean of the model's input standardisation, when it has one."""
        aug = task.augment
        fraction = tuple(aug.tile_fraction or (1.0, 1.0))
        made = cls((float(fraction[0]), float(fraction[1])), float(aug.feature_dropout or 0.0), center)
        if task.input != "bags" or (made.tile_fraction[0] >= 1.0 and made.feature_dropout == 0.0):
            return None
        return made

    def __call__(self, batch: Batch) -> Batch:
        if batch.x.ndim != 3:  # not a bag of tile features
            return batch
        batch = tile_subset(batch, self.tile_fraction)
        if self.feature_dropout > 0:
            x = batch.x.float() if batch.x.dtype == torch.float16 else batch.x  # as the model gets it
            if self.center is None:
                batch.x = F.dropout(x, self.feature_dropout, training=True)
            else:
                batch.x = centred_dropout(x, self.feature_dropout, self.center)
        return batch


__all__ = ["BagAugment", "centred_dropout", "tile_subset"]

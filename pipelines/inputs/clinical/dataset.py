"""A torch Dataset over (path, label, id) rows: read, transform, and (training only) augment.

A file that cannot be read is logged with its path and its sample comes back as {"error": message,
"id", "label"} without "x"; `collate_images` drops those, so one corrupt image costs one sample, never
the run. The paths skipped so far (in this process) are in `ImageDataset.skipped`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from wsi.core.errors import ImageReadError
from wsi.pipelines.inputs.clinical.augment import augment_2d, augment_3d
from wsi.pipelines.inputs.clinical.readers import read_image
from wsi.pipelines.inputs.clinical.transforms import ImageSpec, prepare
from wsi.pipelines.inputs.samples import Sample

log = logging.getLogger(__name__)

ImageRow = tuple[Path, int, str]  # (path, label index or -1, id)


class ImageDataset(Dataset[Sample]):
    """Sample i = {"x": (C, H, W) | (C, D, H, W) float32, "label": int, "id": str} ("error" if unreadable).

    With `augment=True` each sample's augmentation is drawn from a generator seeded from torch's RNG,
    which the training loop seeds per run (and the DataLoader per worker), so a run repeats exactly.
    `seed` (with `set_epoch`) fixes the draws independently of torch's RNG instead.
    """

    def __init__(
        self, rows: Sequence[ImageRow], spec: ImageSpec, *, augment: bool = False, seed: int | None = None
    ) -> None:
        self.rows = [(Path(p), int(label), str(i)) for p, label, i in rows]
        self.spec = spec
        self.augment = augment
        self.seed = seed
        self.epoch = 0
        self.skipped: dict[str, str] = {}  # path -> reason

    def __len__(self) -> int:
        return len(self.rows)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _generator(self, index: int) -> torch.Generator:
        if self.seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        else:  # a fixed, well-mixed seed per (seed, epoch, index)
            seed = hash((self.seed, self.epoch, index)) & (2**62 - 1)
        return torch.Generator().manual_seed(seed)

    def load(self, index: int) -> torch.Tensor:
        """The model input for row `index`, without augmentation; raises ImageReadError."""
        path = self.rows[index][0]
        return prepare(read_image(path, spatial_dims=self.spec.spatial_dims), self.spec)

    def __getitem__(self, index: int) -> Sample:
        path, label, item_id = self.rows[index]
        try:
            x = self.load(index)
        except ImageReadError as exc:
            self.skipped[str(path)] = str(exc)
            log.error("skipping image %s: %s", path, exc)
            return {"error": str(exc), "label": label, "id": item_id}
        if self.augment:
            gen = self._generator(index)
            x = augment_2d(x, gen) if self.spec.spatial_dims == 2 else augment_3d(x, gen)
        return {"x": x, "label": label, "id": item_id}


def collate_images(samples: Sequence[Sample]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Stack the readable samples: x (B, C, ...), labels (B,) int64, ids.

    Unreadable samples are dropped; if none is left, `ImageReadError` carries their messages (so a
    one-image batch in `predict` fails with the reader's reason, naming the file).
    """
    good = [s for s in samples if "error" not in s]
    if not good:
        raise ImageReadError("; ".join(s["error"] for s in samples) or "empty batch")
    x = torch.stack([s["x"] for s in good])  # (B, C, H, W) | (B, C, D, H, W)
    labels = torch.tensor([s["label"] for s in good], dtype=torch.long)
    return x, labels, [s["id"] for s in good]

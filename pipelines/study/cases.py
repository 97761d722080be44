"""Cases: what one row of a study is (a slide, or every slide of a patient) as samples for the model.

`CaseDataset` wraps an input adapter's dataset: each sample gains its target vector (`"target"`,
(T,) float32, NaN = missing) and, for a patient (`level: patient`, an `Item` with `slides`), becomes one
bag of every slide's tiles. A patient's slides keep their own tile positions and are laid side by side
along x, `SLIDE_GAP_UM` apart, so no two slides' tiles share a position (the position encoding and the
heatmaps see distinct places); `"parts"` records where each slide's tiles sit in the joined bag and how
far it was shifted, so contributions and top tiles can be mapped back to each slide.

Training and prediction build their loaders here (`make_loader`), so both see cases the same way.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

from wsi.core.errors import ConfigError, LabelError
from wsi.pipelines.inputs import Batch, InputAdapter, Item
from wsi.pipelines.inputs.samples import Sample, SlidePart

#: space left between two slides of a patient's bag (larger than any tile, so tiles never overlap)
SLIDE_GAP_UM = 2048.0


def join_slides(samples: Sequence[Sample], item: Item) -> Sample:
    """One bag of a patient's slide samples: tiles concatenated, slides laid side by side along x."""
    if any("coords_um" not in s or s["x"].ndim != 2 for s in samples):
        raise ConfigError("level: patient joins feature bags (tiles with coordinates); this input has none")
    coords: list[torch.Tensor] = []
    parts: list[SlidePart] = []
    offset, start = 0.0, 0
    for (slide_id, path), sample in zip(item.slides, samples, strict=True):
        c = sample["coords_um"].to(torch.float32).clone()  # (N_k, 2)
        shift = 0.0
        if len(c):
            shift = offset - float(c[:, 0].min())
            c[:, 0] += shift
            offset = float(c[:, 0].max()) + SLIDE_GAP_UM
        coords.append(c)
        parts.append(
            SlidePart(id=slide_id, path=path, start=start, stop=start + len(c), shift_um=shift)
        )
        start += len(c)
    return {
        "x": torch.cat([s["x"] for s in samples]),  # (sum N_k, D)
        "coords_um": torch.cat(coords),  # (sum N_k, 2)
        "label": item.label,
        "id": item.id,
        "parts": parts,
    }


class CaseDataset(Dataset[Sample]):
    """Sample i = case i's sample from the adapter (joined over slides for a patient) + its target."""

    def __init__(self, adapter: InputAdapter, items: Sequence[Item], *, train: bool, n_targets: int) -> None:
        self.items = list(items)
        self.n_targets = n_targets
        flat: list[Item] = []
        self.spans: list[tuple[int, int]] = []
        for it in self.items:
            parts = [
                Item(id=sid, path=path, label=it.label, patient=it.patient, target=it.target)
                for sid, path in it.slides
            ] or [it]
            self.spans.append((len(flat), len(flat) + len(parts)))
            flat.extend(parts)
        self.base = adapter.dataset(flat, train=train)

    def __len__(self) -> int:
        return len(self.items)

    # Any, not Sample, only while predict (pipelines/predict/stage.py) takes samples as untyped dicts
    def __getitem__(self, index: int) -> Any:
        item = self.items[index]
        start, stop = self.spans[index]
        if item.slides:
            sample = join_slides([self.base[j] for j in range(start, stop)], item)
        else:
            sample = self.base[start].copy()
        target = item.target or (math.nan,) * self.n_targets
        sample["target"] = torch.tensor(target, dtype=torch.float32)  # (T,)
        return sample


class CaseCollate:
    """The adapter's collate, plus the stacked targets (B, T); a class so DataLoader workers can pickle it."""

    def __init__(self, adapter: InputAdapter) -> None:
        self.adapter = adapter

    def __call__(self, samples: Sequence[Any]) -> Batch:  # Samples (Any: see CaseDataset.__getitem__)
        batch = self.adapter.collate(list(samples))
        batch.targets = torch.stack([s["target"] for s in samples]) if samples else None
        return batch


def make_loader(
    adapter: InputAdapter,
    items: Sequence[Item],
    *,
    train: bool,
    batch_size: int,
    num_workers: int,
    device: torch.device,
    n_targets: int,
    generator: torch.Generator | None = None,
    preload_bytes: int = 0,
    balanced: bool = False,
) -> DataLoader[Any]:
    """The loader of `items`. `preload_bytes` > 0: an adapter whose dataset can hold every input in
    memory (bags: `BagDataset.preload`) does so when their files total at most that many bytes, and the
    loader then runs in this process (no worker processes spawned per epoch to re-read a tiny cohort).
    `balanced` (training): an epoch draws len(items) cases with replacement, each with weight N / (cases
    of its class), so every class is drawn equally often on average (CLAM's weighted sampling:
    mahmoodlab/CLAM utils/utils.py:59-60,147-155 @ 53e2409d4a81)."""
    dataset = CaseDataset(adapter, items, train=train, n_targets=n_targets)
    preload = getattr(dataset.base, "preload", None)
    in_memory = preload_bytes > 0 and callable(preload) and bool(preload(preload_bytes))
    sampler = _balanced_sampler(items, generator) if train and balanced else None
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=train and sampler is None,
        sampler=sampler,
        generator=generator if train and sampler is None else None,
        num_workers=0 if in_memory else num_workers,
        collate_fn=CaseCollate(adapter),
        pin_memory=device.type == "cuda",
        persistent_workers=False,
    )


def _balanced_sampler(items: Sequence[Item], generator: torch.Generator | None) -> WeightedRandomSampler:
    """Draws len(items) cases with replacement, each weighted N / (cases of its class)."""
    counts = Counter(it.label for it in items)
    weights = [len(items) / counts[it.label] for it in items]
    return WeightedRandomSampler(weights, num_samples=len(items), replacement=True, generator=generator)


def _target_key(target: tuple[float, ...]) -> tuple[str, ...]:
    return tuple("missing" if math.isnan(v) else repr(v) for v in target)


def group_by_patient(items: Sequence[Item], where: str = "labels") -> list[Item]:
    """One case per patient (`level: patient`): id = the patient, `slides` = its slides in id order.

    A patient's slides must carry the same label (LabelError naming the patient and slides)."""
    by_patient: dict[str, list[Item]] = {}
    for it in items:
        by_patient.setdefault(it.group, []).append(it)
    cases: list[Item] = []
    for patient, slides in by_patient.items():
        slides = sorted(slides, key=lambda it: it.id)
        if len({_target_key(it.target) for it in slides}) > 1 or len({it.label for it in slides}) > 1:
            listed = ", ".join(f"{it.id}: {list(it.target)}" for it in slides[:5])
            raise LabelError(
                f"{where}: patient {patient}'s slides have different labels ({listed}); a patient-level "
                "task needs one label per patient"
            )
        first = slides[0]
        cases.append(
            Item(id=patient, path=first.path, label=first.label, patient=patient, target=first.target,
                 slides=tuple((it.id, it.path) for it in slides))
        )  # fmt: skip
    return cases


def slide_count(items: Sequence[Item]) -> int:
    """Slides behind the cases (a patient case counts each of its slides)."""
    return sum(len(it.slides) or 1 for it in items)


__all__ = [
    "SLIDE_GAP_UM",
    "CaseCollate",
    "CaseDataset",
    "group_by_patient",
    "join_slides",
    "make_loader",
    "slide_count",
]

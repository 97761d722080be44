"""Input adapters: how a task's items (feature bags, images) reach the training loop and `predict`.

A task YAML names its input (`input: bags` or `input: images`) and may pass options to it
(`input_options: {...}`, validated by the adapter's constructor; unknown keys raise `ConfigError`).
The loop and `predict` only ever talk to the adapter through this protocol, so a new kind of input is
one module whose adapter class carries `@INPUTS.register("<name>")` (and that module named in `INPUTS`).

Protocol (`InputAdapter`):

  name                         "bags" | "images" | ...; also the task YAML's `input:` value
  source_option                the CLI option that gives the source ("--features", "--images")
  find(sources)                -> {item_id: path}: every usable file under the given files/folders.
                               Ids are what a label table's slide column is matched against (a file
                               name also matches: the label code strips known suffixes). Duplicate
                               ids raise `ConfigError` naming both files.
  dataset(items, train=...)    -> torch Dataset over `Item`s; sample i is a dict
                               {"x": Tensor, "label": int (-1 when unlabeled), "id": str,
                                optional "coords_um": Tensor (N, 2)}. `train=True` turns on the
                               adapter's augmentation (bag subsampling, image flips...).
  collate(samples)             -> `Batch` (bags: pad to the longest bag, mask True = real tile;
                               images: stack).
  model_kwargs(items)          -> extra `models.build_model` kwargs the data decides (bags: in_dim;
                               images: in_chans / img_size).
  provenance(items)            -> JSON-able dict saved in the run's config.json (bags: encoder id,
                               weights sha256, tile size/MPP/params); `predict` hands it back to
  check_compatible(prov, items)  which raises `ConfigError` when new inputs were made differently
                               (e.g. features from another encoder).
  heatmap(item, sample, values, out_png, title="")   optional: draw per-token values (N,) (the
                               contribution of each tile/patch to the predicted class) for one item;
                               `predict` skips heatmaps for adapters without it.

`INPUTS` (a `wsi.registry.Registry`) maps a name to its adapter class; the adapter modules are imported
on the first lookup, so their readers (DICOM, NIfTI...) cost nothing until a task asks for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch.utils.data import Dataset

from wsi.errors import ConfigError
from wsi.registry import Registry


@dataclass(frozen=True)
class Item:
    """One labelled (or, for predict, unlabelled) input: a slide's bag, an image, a volume."""

    id: str
    path: Path
    label: int = -1  # class index into the task's classes (other kinds: the split stratum); -1 = unknown
    patient: str = ""  # split grouping key; defaults to `id` when empty
    target: tuple[float, ...] = ()  # the label as the task kind's target vector (NaN = missing)
    slides: tuple[tuple[str, Path], ...] = ()  # level: patient: (slide id, bag) of each slide, in order

    @property
    def group(self) -> str:
        return self.patient or self.id


@dataclass
class Batch:
    """What `collate` returns and the loop consumes.

    `extra` holds keyword tensors for the model's forward and `tile_contributions`
    (bags: {"mask": (B, N) bool, "coords_um": (B, N, 2)}; images: {}).
    """

    x: torch.Tensor
    labels: torch.Tensor  # (B,) int64; -1 where unknown
    ids: list[str]
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    targets: torch.Tensor | None = None  # (B, T) float32 target vectors (pipelines.cases adds them)

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Batch:
        return Batch(
            x=self.x.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
            ids=self.ids,
            extra={k: v.to(device, non_blocking=non_blocking) for k, v in self.extra.items()},
            targets=None if self.targets is None else self.targets.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> Batch:  # called by DataLoader(pin_memory=True)
        return Batch(
            x=self.x.pin_memory(),
            labels=self.labels.pin_memory(),
            ids=self.ids,
            extra={k: v.pin_memory() for k, v in self.extra.items()},
            targets=None if self.targets is None else self.targets.pin_memory(),
        )


@runtime_checkable
class InputAdapter(Protocol):
    name: ClassVar[str]
    source_option: ClassVar[str]

    def find(self, sources: Sequence[Path]) -> dict[str, Path]: ...

    def dataset(self, items: Sequence[Item], *, train: bool) -> Dataset[dict[str, Any]]: ...

    def collate(self, samples: list[dict[str, Any]]) -> Batch: ...

    def model_kwargs(self, items: Sequence[Item]) -> dict[str, Any]: ...

    def provenance(self, items: Sequence[Item]) -> dict[str, Any]: ...

    def check_compatible(self, provenance: Mapping[str, Any], items: Sequence[Item]) -> None: ...


# name -> adapter class, constructed with the task's `input_options` as keywords
INPUTS: Registry[Callable[..., InputAdapter]] = Registry(
    "input", modules=("wsi.pipelines.inputs.bags", "wsi.pipelines.inputs.images")
)


def available_inputs() -> list[str]:
    return INPUTS.names()


def build_input(name: str, options: Mapping[str, Any] | None = None) -> InputAdapter:
    """The input adapter `name`, configured by the task's `input_options`."""
    adapter_cls = INPUTS.get(name)  # ConfigError naming the known inputs (and any that failed to load)
    try:
        return adapter_cls(**dict(options or {}))
    except TypeError as exc:
        raise ConfigError(f"bad input_options for input {name!r}: {exc}") from exc


__all__ = ["INPUTS", "Batch", "InputAdapter", "Item", "available_inputs", "build_input"]

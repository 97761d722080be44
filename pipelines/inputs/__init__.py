"""Input adapters: how a task's items (feature bags, images, slide embeddings) reach the loop and `predict`.

A task YAML names its input (`input: bags`) and may pass options to it (`input_options: {...}`,
validated by the adapter's constructor; unknown keys raise `ConfigError`). The loop and `predict` only
talk to the adapter through the `InputAdapter` protocol, so a new kind of input is one module whose
class carries `@INPUTS.register("<name>")` (and that module named in `INPUTS`). `INPUTS` imports the
adapter modules on the first lookup, so their readers (DICOM, NIfTI...) cost nothing until asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypedDict, runtime_checkable

import torch
from torch.utils.data import Dataset

from wsi.core.errors import ConfigError
from wsi.core.json_types import JsonObject, JsonValue
from wsi.core.registry import Registry
from wsi.core.renamed import renamed
from wsi.pipelines.inputs.samples import Sample

log = logging.getLogger(__name__)


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

    `mask` and `coords_um` are the model's keyword inputs (`model(x, **batch.model_inputs())`, and
    `tile_contributions`): bags give a mask only when some bag is padded and micrometres only when every
    bag has them; images give neither.
    """

    x: torch.Tensor
    labels: torch.Tensor  # (B,) int64; -1 where unknown
    ids: list[str]
    mask: torch.Tensor | None = None  # (B, N) bool, True on real tiles
    coords_um: torch.Tensor | None = None  # (B, N, 2) float32 tile top-left in micrometres
    targets: torch.Tensor | None = None  # (B, T) float32 target vectors (pipelines.study.cases adds them)

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """The keyword inputs the batch has, for the model's forward."""
        given = {"mask": self.mask, "coords_um": self.coords_um}
        return {k: v for k, v in given.items() if v is not None}

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        def opt(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else fn(t)

        return Batch(
            x=fn(self.x), labels=fn(self.labels), ids=self.ids, mask=opt(self.mask),
            coords_um=opt(self.coords_um), targets=opt(self.targets),
        )  # fmt: skip

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:  # called by DataLoader(pin_memory=True)
        return self._map(lambda t: t.pin_memory())


class DataModelKwargs(TypedDict, total=False):
    """The `models.build_model` arguments the data decides (`InputAdapter.model_kwargs`)."""

    in_dim: int  # bags, slide embeddings: the feature width
    in_channels: int  # images: 1 or 3


@runtime_checkable
class InputAdapter(Protocol):
    """What the loop and `predict` know of an input. Optional: `heatmap(item, sample, values, out_png,
    title="")` draws per-token values (N,) for one item; `predict` skips heatmaps without it."""

    name: ClassVar[str]  # "bags" | "images" | ...: the task YAML's `input:` value
    source_option: ClassVar[str]  # the CLI option that gives the source ("--features", "--images")

    def find(self, sources: Sequence[Path]) -> dict[str, Path]:
        """{item_id: path} of every usable file under the given files/folders; ids are what a label
        table's slide column is matched against (a file name also matches). Duplicate ids: ConfigError
        naming both files."""
        ...

    def dataset(self, items: Sequence[Item], *, train: bool) -> Dataset[Sample]:
        """Sample i is {"x", "label" (-1 when unlabelled), "id", optional "coords_um" (N, 2)}; `train`
        turns on the adapter's augmentation (bag subsets, image flips...)."""
        ...

    def collate(self, samples: list[Sample]) -> Batch:
        """Bags: padded to the longest bag, mask True = real tile; images: stacked."""
        ...

    def model_kwargs(self, items: Sequence[Item]) -> DataModelKwargs:
        """The `models.build_model` arguments the data decides."""
        ...

    def provenance(self, items: Sequence[Item]) -> JsonObject:
        """Saved in the run's config.json (bags: encoder id, weights sha256, tile settings)."""
        ...

    def check_compatible(self, provenance: Mapping[str, JsonValue], items: Sequence[Item]) -> None:
        """ConfigError when new inputs were made differently from `provenance` (another encoder...)."""
        ...


# name -> adapter class, constructed with the task's `input_options` as keywords
INPUTS: Registry[Callable[..., InputAdapter]] = Registry(
    "input",
    modules=(
        "wsi.pipelines.inputs.bags",
        "wsi.pipelines.inputs.images",
        "wsi.pipelines.inputs.slide_embeddings",
    ),
)


def list_inputs() -> list[str]:
    """Input adapters by name (a task's `input:`)."""
    return INPUTS.names()


available_inputs = renamed(list_inputs, "wsi.pipelines.inputs.available_inputs")  # the old name


def build_input(name: str, options: Mapping[str, Any] | None = None) -> InputAdapter:
    """The input adapter `name`, configured by the task's `input_options`."""
    adapter_cls = INPUTS.get(name)  # ConfigError naming the known inputs (and any that failed to load)
    try:
        return adapter_cls(**dict(options or {}))
    except (TypeError, ValueError) as exc:  # an unknown option; a number out of its range
        raise ConfigError(f"bad input_options for input {name!r}: {exc}") from None


def with_resolution(
    adapter: InputAdapter,
    *,
    mpp: float | None,
    mpp_by_slide: Mapping[str, float],
    uses_positions: bool,
    what: str = "input",
) -> InputAdapter:
    """The adapter told the slides' resolution (a labels CSV `mpp` column per slide wins over `mpp`) and
    whether the model reads tile positions (only then do bags in level-0 pixels need one). An input
    without slides (images) refuses an `mpp`; train and predict both come here."""
    tell = getattr(adapter, "with_resolution", None)
    if tell is None:
        if mpp is not None:
            raise ConfigError(f"--mpp gives slides' level-0 um/px; {what} {adapter.name!r}: leave it out")
        if mpp_by_slide:
            log.warning("the labels CSV `mpp` column is not used by input %r", adapter.name)
        return adapter
    resolved: InputAdapter = tell(
        mpp=mpp, mpp_by_slide=dict(mpp_by_slide) or None, uses_positions=uses_positions
    )
    return resolved


__all__ = [
    "INPUTS",
    "Batch",
    "DataModelKwargs",
    "InputAdapter",
    "Item",
    "available_inputs",
    "build_input",
    "list_inputs",
    "with_resolution",
]

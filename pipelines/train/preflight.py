"""Checks made before a run trains anything: every input usable, every bag placeable.

One NaN in one bag makes every weight of a model NaN after a single step, and a bag in level-0 pixels
with no known resolution fails only when it is first loaded, maybe hours in. So `wsi train` (one split
or `--cv`) looks at every bag of the cohort first and refuses the run once, listing every bag that
cannot be used and why (NaN / infinite features, unreadable, empty, no resolution for a model that
uses tile positions), instead of stopping at the first one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wsi.core.errors import BagFormatError, ConfigError
from wsi.pipelines.inputs import InputAdapter, Item
from wsi.pipelines.study.tasks import TaskConfig


def unusable_items(adapter: InputAdapter, items: Sequence[Item]) -> list[tuple[Item, str]]:
    """Every item the adapter cannot use, with a reason naming its file; [] for adapters without checks.

    Bags: non-finite, unreadable or empty (`BagInput.bad_items`, bounded memory per bag); then, of the
    rest, those whose tiles cannot be placed in micrometres when the model needs positions (a bag in
    level-0 pixels without --mpp, an `mpp` column or an attribute that gives its resolution)."""
    bad_items = getattr(adapter, "bad_items", None)
    if bad_items is None:
        return []
    bad: list[tuple[Item, str]] = list(bad_items(items))
    known = {item.path for item, _ in bad}
    dataset: Any = adapter.dataset([it for it in items if it.path not in known], train=False)
    mpp_for = getattr(dataset, "mpp_for", None)
    if mpp_for is None or not getattr(dataset, "uses_positions", False):
        return bad
    from wsi.formats.bags import read_bag

    for item in dataset.items:
        try:  # one tile: what placing needs (the whole grid is read only for a tile size inferred)
            read_bag(item.path, mpp=mpp_for(item), rows=slice(0, 1), require_um=True)
        except BagFormatError as exc:
            bad.append((item, str(exc)))
    order = {item.path: k for k, item in enumerate(items)}
    return sorted(bad, key=lambda pair: order[pair[0].path])


def refuse_unusable(adapter: InputAdapter, items: Sequence[Item]) -> None:
    """Raise BagFormatError listing every unusable item (one line each) before anything is trained."""
    bad = unusable_items(adapter, items)
    if not bad:
        return
    lines = "\n".join(f"  {why}" for _, why in bad)
    raise BagFormatError(
        f"{len(bad)} of the {len(items)} labelled input(s) cannot be used, so nothing was trained:\n"
        f"{lines}\nFix or re-create them, or leave their rows out of the labels CSV."
    )


def refuse_model_for_kind(task: TaskConfig) -> None:
    """ConfigError when the task's model does not train the task's kind (CLAM, DSMIL and DTFD-MIL train
    categorical tasks only: their authors' losses need each bag's class), naming both and why."""
    from wsi.models.base.kinds import MODEL_KINDS
    from wsi.models.presets import preset_kind

    if task.model.preset is None:
        return
    model_kind = preset_kind(task.model.preset)
    model = MODEL_KINDS.get(model_kind)
    if model.task_kinds is None or task.kind in model.task_kinds:
        return
    others = "abmil or transmil" if task.input == "bags" else "another preset"
    raise ConfigError(
        f"model {task.model.preset} ({model_kind}) trains {' and '.join(model.task_kinds)} tasks only: "
        f"{model.task_kinds_reason}; task {task.name!r} is {task.kind}. Choose {others} (--preset)"
    )


def refuse_model_for_input(task: TaskConfig) -> None:
    """ConfigError when the task's model does not read the task's input (a ViT for images given feature
    bags, a bag model given images), naming the preset, the input and presets that read it."""
    from wsi.models.base.kinds import MODEL_KINDS
    from wsi.models.presets import list_models, preset_kind

    if task.model.preset is None:
        return
    model = MODEL_KINDS.get(preset_kind(task.model.preset))
    if model.inputs is None or task.input in model.inputs:
        return
    readers = [
        p for p in list_models() if MODEL_KINDS.get(preset_kind(p)).inputs in (None, (task.input,))
    ]
    raise ConfigError(
        f"model {task.model.preset} reads {' or '.join(model.inputs)}; task {task.name!r} gives "
        f"{task.input}. Choose a preset that reads {task.input}: {', '.join(readers)} (--preset)"
    )


__all__ = ["refuse_model_for_input", "refuse_model_for_kind", "refuse_unusable", "unusable_items"]

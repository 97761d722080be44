"""Model kinds: the `kind` field of a preset names a model class registered here.

Each model class registers itself beside its definition (`@MODEL_KINDS.register("mil")`) and names its
typed config in `config_class`; `models.presets` looks a kind up and parses the preset into that
config. A new kind is a new module plus one line in the module list below.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from torch import nn

from wsi.core.json_types import JsonObject
from wsi.core.registry import Registry


class KindConfig(Protocol):
    """What every model kind's config offers: its `kind` name and plain JSON-ready data."""

    @property
    def kind(self) -> str: ...

    def to_dict(self) -> JsonObject: ...


class KindModel(nn.Module):
    """Base of every registered model: built from one typed config, serialised back to a plain dict.

    `task_kinds` names the task kinds the model trains (None: every kind); a model whose authors' loss
    needs a class per bag (CLAM, DSMIL, DTFD-MIL) says `("categorical",)` and `wsi train` refuses the
    others by name, giving `task_kinds_reason`. `explains_by` says what `wsi predict` draws per tile:
    "contributions" (`tile_contributions`, each tile's additive share of the logits) or "attention"
    (`attention_weights`, for a model whose logits have no additive per-tile decomposition: its
    `tile_contributions` refuses, naming why). `inputs` names the task inputs it reads (None: any); `wsi
    train` refuses another by name (`pipelines.train.preflight.refuse_model_for_input`).
    """

    config_class: ClassVar[type[Any]]  # the @config_model dataclass `models.presets` parses a preset into
    config: KindConfig
    task_kinds: ClassVar[tuple[str, ...] | None] = None
    task_kinds_reason: ClassVar[str] = ""
    explains_by: ClassVar[str] = "contributions"
    inputs: ClassVar[tuple[str, ...] | None] = None

    def to_dict(self) -> JsonObject:
        """The resolved config as plain JSON-ready data (`kind` included); rebuilds the architecture."""
        return self.config.to_dict()

    def config_dict(self) -> JsonObject:
        """Alias of `to_dict` (the name docs/api.md has always used)."""
        return self.to_dict()


MODEL_KINDS: Registry[type[KindModel]] = Registry(
    "model kind",
    modules=(
        "wsi.models.mil", "wsi.models.vit", "wsi.models.abmil", "wsi.models.heads",
        "wsi.models.baselines.transmil", "wsi.models.baselines.clam", "wsi.models.baselines.dsmil",
        "wsi.models.baselines.dtfd",
    ),
)  # fmt: skip

__all__ = ["MODEL_KINDS", "KindConfig", "KindModel"]

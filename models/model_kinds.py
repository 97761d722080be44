"""Model kinds: the `kind` field of a preset names a model class registered here.

Each model class registers itself beside its definition (`@MODEL_KINDS.register("mil")`) and names its
typed config in `config_class`; `models.presets` looks a kind up and parses the preset into that
config. A new kind is a new module plus one line in the module list below.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from torch import nn

from wsi.json_types import JsonObject
from wsi.registry import Registry


class KindConfig(Protocol):
    """What every model kind's config offers: its `kind` name and plain JSON-ready data."""

    @property
    def kind(self) -> str: ...

    def to_dict(self) -> JsonObject: ...


class KindModel(nn.Module):
    """Base of every registered model: built from one typed config, serialised back to a plain dict."""

    config_class: ClassVar[type[Any]]  # the @config_model dataclass `models.presets` parses a preset into
    config: KindConfig

    def to_dict(self) -> JsonObject:
        """The resolved config as plain JSON-ready data (`kind` included); rebuilds the architecture."""
        return self.config.to_dict()

    def config_dict(self) -> JsonObject:
        """Alias of `to_dict` (the name docs/api.md has always used)."""
        return self.to_dict()


MODEL_KINDS: Registry[type[KindModel]] = Registry(
    "model kind",
    modules=("wsi.models.mil", "wsi.models.vit", "wsi.models.abmil", "wsi.models.heads"),
)

__all__ = ["MODEL_KINDS", "KindConfig", "KindModel"]

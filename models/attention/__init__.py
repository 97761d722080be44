"""Attention variants behind one factory: `build_attention(name, dim, heads, **options)`.

Every variant maps x (B, N, dim) with an optional (B, N) bool mask (True = real token) to (B, N, dim);
see docs/api.md for the options of each.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from models.attention._base import AttentionBase
from models.attention.gdla import GDLAttention
from models.attention.seqnorm import SeqNormAttention
from models.attention.sima import SimAAttention
from models.attention.softmax import SoftmaxAttention
from wsi.errors import ConfigError

_REGISTRY: dict[str, type[AttentionBase]] = {
    "seqnorm": SeqNormAttention,
    "softmax": SoftmaxAttention,
    "sima": SimAAttention,
    "gdla": GDLAttention,
}
_COMMON_OPTIONS = ("inner_dim", "bias", "dropout")
LINEAR_VARIANTS = frozenset({"seqnorm", "sima", "gdla"})


def available_attention() -> list[str]:
    return sorted(_REGISTRY)


def attention_options(name: str) -> list[str]:
    """Keyword options a variant accepts."""
    cls = _attention_class(name)
    params = inspect.signature(cls.__init__).parameters
    own = [p for p in params if p not in {"self", "dim", "heads", "options"}]
    return sorted(set(own) | set(_COMMON_OPTIONS))


def _attention_class(name: str) -> type[AttentionBase]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown attention {name!r}; choose one of {', '.join(available_attention())}"
        ) from None


def build_attention(name: str, dim: int, heads: int, **options: object) -> nn.Module:
    """Build the attention variant `name` for tokens of width `dim` with `heads` heads."""
    cls: Callable[..., AttentionBase] = _attention_class(name)
    unknown = set(options) - set(attention_options(name))
    if unknown:
        raise ConfigError(
            f"attention {name!r} has no option(s) {', '.join(sorted(unknown))}; "
            f"it takes {', '.join(attention_options(name))}"
        )
    return cls(int(dim), int(heads), **options)


__all__ = ["LINEAR_VARIANTS", "AttentionBase", "attention_options", "available_attention", "build_attention"]

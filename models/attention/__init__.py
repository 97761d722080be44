"""Attention variants behind one factory: `build_attention(name, dim, heads, **options)`.

Every variant maps x (B, N, dim) with an optional (B, N) bool mask (True = real token) to (B, N, dim);
see docs/api.md for the options of each. Variants register themselves in `ATTENTION` with a decorator
beside their class; a new variant is a new module here plus one line in `ATTENTION`'s module list.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from wsi.core.errors import ConfigError
from wsi.core.renamed import renamed
from wsi.models.attention._base import ATTENTION, AttentionBase, StreamState
from wsi.models.attention._masking import weighted

_COMMON_OPTIONS = ("inner_dim", "bias", "dropout")


def list_attention() -> list[str]:
    """Attention variants by name (`build_attention(name, ...)`)."""
    return ATTENTION.names()


available_attention = renamed(list_attention, "wsi.models.attention.available_attention")  # the old name


def attention_options(name: str) -> list[str]:
    """Keyword options a variant accepts."""
    params = inspect.signature(ATTENTION.get(name).__init__).parameters
    own = [p for p in params if p not in {"self", "dim", "heads", "options"}]
    return sorted(set(own) | set(_COMMON_OPTIONS))


def build_attention(name: str, dim: int, heads: int, **options: object) -> AttentionBase:
    """Build the attention variant `name` for tokens of width `dim` with `heads` heads."""
    cls: Callable[..., AttentionBase] = ATTENTION.get(name)
    unknown = set(options) - set(attention_options(name))
    if unknown:
        raise ConfigError(
            f"attention {name!r} has no option(s) {', '.join(sorted(unknown))}; "
            f"it takes {', '.join(attention_options(name))}"
        )
    return cls(int(dim), int(heads), **options)


# Variants whose cost grows linearly with the number of tokens (each class says so itself).
LINEAR_VARIANTS = frozenset(name for name in ATTENTION.names() if ATTENTION.get(name).linear)

__all__ = [
    "ATTENTION",
    "LINEAR_VARIANTS",
    "AttentionBase",
    "StreamState",
    "attention_options",
    "available_attention",
    "build_attention",
    "list_attention",
    "weighted",
]

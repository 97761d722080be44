"""`build_attention(name, dim, heads, **options)`: one factory over the ATTENTION registry, with each
variant's options checked by name before it is built."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from wsi.core.errors import ConfigError
from wsi.models.attention._base import ATTENTION, AttentionBase

_COMMON_OPTIONS = ("inner_dim", "bias", "dropout")


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

__all__ = ["LINEAR_VARIANTS", "attention_options", "build_attention"]

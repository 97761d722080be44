"""Attention variants behind one factory: `build_attention(name, dim, heads, **options)`.

Every variant maps x (B, N, dim) with an optional (B, N) bool mask (True = real token) to (B, N, dim);
see docs/api.md for the options of each. Variants register themselves in `ATTENTION` with a decorator
beside their class; a new variant is a new module here plus one row in names.py's table. Importing the
package imports no torch: each name loads its module on first use, and `list_attention` reads names.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wsi.core.lazy import lazy_exports
from wsi.core.renamed import renamed
from wsi.models.attention.names import list_attention

if TYPE_CHECKING:
    from wsi.models.attention._base import ATTENTION, AttentionBase, StreamState
    from wsi.models.attention._masking import weighted
    from wsi.models.attention.build import LINEAR_VARIANTS, attention_options, build_attention
else:
    __getattr__, __dir__ = lazy_exports(__name__, {
        "wsi.models.attention._base": ("ATTENTION", "AttentionBase", "StreamState"),
        "wsi.models.attention._masking": ("weighted",),
        "wsi.models.attention.build": ("LINEAR_VARIANTS", "attention_options", "build_attention"),
    })  # fmt: skip

available_attention = renamed(list_attention, "wsi.models.attention.available_attention")  # the old name

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

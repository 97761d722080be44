"""The attention variants by name and the module that defines each, read without importing torch.

`ATTENTION` imports these modules on its first lookup; `list_attention` answers from this table alone,
so listing the variants costs nothing (tests/wsi/test_api.py checks that it names what `ATTENTION`
holds). A new variant is a new module plus one row here.
"""

from __future__ import annotations

VARIANT_MODULES: dict[str, str] = {
    "seqnorm": "wsi.models.attention.seqnorm",
    "softmax": "wsi.models.attention.softmax",
    "sima": "wsi.models.attention.sima",
    "gdla": "wsi.models.attention.gdla",
}


def list_attention() -> list[str]:
    """Attention variants by name (`build_attention(name, ...)`)."""
    return sorted(VARIANT_MODULES)


__all__ = ["VARIANT_MODULES", "list_attention"]

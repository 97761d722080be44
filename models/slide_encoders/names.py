"""The slide encoders by name and the module that defines each, read without importing torch.

`SLIDE_ENCODERS` imports these modules on its first lookup; `list_slide_encoders` answers from this
table alone (tests/wsi/test_api.py checks that it names what `SLIDE_ENCODERS` holds). A new encoder is
its module plus one row here per name it registers.
"""

from __future__ import annotations

ENCODER_MODULES: dict[str, str] = {
    "feather": "wsi.models.slide_encoders.feather",
    "feather-uni": "wsi.models.slide_encoders.feather",
    "feather-uni2": "wsi.models.slide_encoders.feather",
    "chief": "wsi.models.slide_encoders.chief",
    "prism": "wsi.models.slide_encoders.prism",
    "gigapath": "wsi.models.slide_encoders.gigapath",
    "gigapath-last": "wsi.models.slide_encoders.gigapath",
    "titan": "wsi.models.slide_encoders.titan",
    "madeleine": "wsi.models.slide_encoders.madeleine",
    "cobra-uni": "wsi.models.slide_encoders.cobra",
    "cobra-h-optimus-0": "wsi.models.slide_encoders.cobra",
    "cobra-virchow2": "wsi.models.slide_encoders.cobra",
    "cobra-conch": "wsi.models.slide_encoders.cobra",
}


def list_slide_encoders() -> list[str]:
    """Slide encoders by name (`build_slide_encoder(name, ...)`, `wsi embed-slides --encoder`)."""
    return sorted(ENCODER_MODULES)


__all__ = ["ENCODER_MODULES", "list_slide_encoders"]

"""The text towers by name and the module that defines each, read without importing torch.

`TEXT_ENCODERS` imports these modules on its first lookup; `list_text_encoders` answers from this table
alone (tests/wsi/test_api.py checks that it names what `TEXT_ENCODERS` holds). A new tower is its module
plus one row here per name it registers.
"""

from __future__ import annotations

TOWER_MODULES: dict[str, str] = {
    "conch-v1": "wsi.models.text_encoders.coca",
    "titan": "wsi.models.text_encoders.coca",
    "plip": "wsi.models.text_encoders.clip",
    "prism": "wsi.models.text_encoders.biogpt",
}


def list_text_encoders() -> list[str]:
    """Text towers by name (`build_text_encoder(name, ...)`, `wsi.zero_shot(model=...)`)."""
    return sorted(TOWER_MODULES)


__all__ = ["TOWER_MODULES", "list_text_encoders"]

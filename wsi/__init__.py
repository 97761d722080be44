"""wsi: whole-slide images to tiles, feature bags and slide-level predictions.

The front door (`wsi/api.py`): `wsi.tile`, `wsi.embed`, `wsi.train`, `wsi.predict`, `wsi.zero_shot`,
`wsi.retrieve`, `wsi.open_slide`, `wsi.read_bag`, and `wsi.list_encoders` / `list_models` /
`list_attention` / `list_slide_encoders` / `list_text_encoders` / `list_tasks`. Importing wsi loads none
of the heavy libraries; a call loads what it needs.
"""

from wsi.api import (
    embed,
    list_attention,
    list_encoders,
    list_models,
    list_slide_encoders,
    list_tasks,
    list_text_encoders,
    open_slide,
    predict,
    read_bag,
    retrieve,
    tile,
    train,
    zero_shot,
)
from wsi.core.version import __version__

__all__ = [
    "__version__",
    "embed",
    "list_attention",
    "list_encoders",
    "list_models",
    "list_slide_encoders",
    "list_tasks",
    "list_text_encoders",
    "open_slide",
    "predict",
    "read_bag",
    "retrieve",
    "tile",
    "train",
    "zero_shot",
]

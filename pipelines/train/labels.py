"""Label tables, where training has always found them; the code lives in `pipelines.labels` (shared
with `wsi predict --labels`, which never imports the training code)."""

from wsi.pipelines.labels import (
    LabelRow,
    Matched,
    default_patient,
    match_items,
    read_label_table,
    read_labels,
    slide_keys,
)

__all__ = [
    "LabelRow",
    "Matched",
    "default_patient",
    "match_items",
    "read_label_table",
    "read_labels",
    "slide_keys",
]

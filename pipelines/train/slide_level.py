"""Training on slide embeddings: a bag task given a folder of `wsi embed-slides` (or STAMP) embeddings
trains a head on them instead of a MIL model, with everything else (labels, splits, CV, report) kept."""

from __future__ import annotations

import logging
from pathlib import Path

from wsi.pipelines.inputs.slide_embeddings import is_embedding_folder
from wsi.pipelines.tasks import TaskConfig

log = logging.getLogger(__name__)

#: model kinds that read one embedding per slide; any other preset is a MIL model over tiles
HEAD_KINDS = ("linear", "mlp")
DEFAULT_HEAD = "linear"


def for_features(task: TaskConfig, features_dir: str | Path | None) -> TaskConfig:
    """`task` switched to `input: slide-embeddings` (and a head) when `features_dir` holds embeddings."""
    if features_dir is None or task.input != "bags" or not is_embedding_folder(Path(features_dir)):
        return task
    from wsi.models.presets import preset_kind

    preset, overrides = task.model.preset, task.model.overrides
    if preset is None or preset_kind(preset) not in HEAD_KINDS:
        log.info("%s holds slide embeddings: training the %s head on them (task preset: %s)",
                 features_dir, DEFAULT_HEAD, preset)  # fmt: skip
        preset, overrides = DEFAULT_HEAD, {}  # the MIL model's overrides (depth, dim) mean nothing here
    return task.replace(**{
        "input": "slide-embeddings", "input_options": {}, "model.preset": preset, "model.attention": None,
        "model.overrides": overrides,
    })  # fmt: skip

"""Training on slide embeddings: a bag task given a folder of `wsi embed-slides` (or STAMP) embeddings
trains a head on them instead of a MIL model, with everything else (labels, splits, CV, report) kept.

`for_features` switches the task's input; which head it trains is the recipe's choice with every other
preset (`pipelines.train.recipe.resolve_preset`)."""

from __future__ import annotations

import logging
from pathlib import Path

from wsi.pipelines.inputs.slide_embeddings import is_embedding_folder
from wsi.pipelines.study.tasks import TaskConfig

log = logging.getLogger(__name__)

#: model kinds that read one embedding per slide; any other preset is a MIL model over tiles
HEAD_KINDS = ("linear", "mlp")
DEFAULT_HEAD = "linear"


def for_features(task: TaskConfig, features_dir: str | Path | None) -> TaskConfig:
    """`task` switched to `input: slide-embeddings` when `features_dir` holds embeddings (a head has no
    attention variant: the MIL model's is dropped)."""
    if features_dir is None or task.input != "bags" or not is_embedding_folder(Path(features_dir)):
        return task
    log.info("%s holds slide embeddings: a head is trained on them", features_dir)
    return task.replace(**{"input": "slide-embeddings", "input_options": {}, "model.attention": None})

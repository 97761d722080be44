"""Training: tasks, labels, splits, the loop, checkpoints, metrics and cross-validation.

Public API:
  train(task=..., labels_csv=..., out_dir=..., features_dir=... | images_dir=..., **options) -> TrainResult
  load_task(name_or_path) -> TaskConfig
See pipelines/train/run.py for the run-folder layout.
"""

from pipelines.train.run import TrainResult, train
from pipelines.train.tasks import TaskConfig, load_task

__all__ = ["TaskConfig", "TrainResult", "load_task", "train"]

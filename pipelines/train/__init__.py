"""Training: labels, splits, the loop, its state, evaluation, folds and cross-validation.

Public API:
  train(task=..., labels_csv=..., out_dir=..., features_dir=... | images_dir=..., **options) -> TrainResult
Tasks (`load_task`, `TaskConfig`) live in `wsi.pipelines.tasks`, shared with predict.
See pipelines/train/run.py for the run-folder layout and pipelines/run_record.py for its config.json.
"""

from wsi.pipelines.train.run import TrainResult, train

__all__ = ["TrainResult", "train"]

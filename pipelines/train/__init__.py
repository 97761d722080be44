"""Training: labels, splits, the loop, its state, evaluation, folds and cross-validation.

Public API:
  train(task, labels_csv=..., out_dir=..., options=TrainOptions(...) | **its fields) -> TrainResult
  TrainOptions     every setting of a run: inputs, task changes, device, cv, resume... (train/config.py)
  TrainResult      .metrics: RunMetrics (one run) or CvMetrics (--cv), what metrics.json holds
Tasks (`load_task`, `TaskConfig`) live in `wsi.pipelines.study.tasks`, shared with predict.
See pipelines/train/run.py for the run-folder layout and pipelines/runs/record.py for its config.json.
"""

from wsi.pipelines.train.config import TrainOptions
from wsi.pipelines.train.results import CvMetrics, FigureSummary, RunMetrics, TrainResult
from wsi.pipelines.train.run import train

__all__ = ["CvMetrics", "FigureSummary", "RunMetrics", "TrainOptions", "TrainResult", "train"]

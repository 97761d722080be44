"""What a training run returns: its metrics.json as typed records, and the cross-validation summary.

`RunMetrics` is metrics.json of one run folder (a plain run, or one fold): which split was scored,
how many cases, the best epoch, a note when the figures are not the test split's, and the task
kind's own figures (categorical: auroc, accuracy, ... with 95% intervals; `TaskKind.summary_line`
reads them). `CvMetrics` is metrics.json at the top of a cross-validation run: the mean and standard
deviation of each summary figure over the folds, the pooled test predictions' figures, and each
fold's `RunMetrics`. Both index like the JSON they are written as (`metrics["auroc"]`), for callers
that read figures by name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from wsi.core.files import write_csv_atomic, write_json_atomic
from wsi.pipelines.report import write_report
from wsi.pipelines.runs.record import record_path
from wsi.pipelines.scheduling.results import JobResult, StageResult
from wsi.pipelines.study.kinds import PredictionSet, TaskKind
from wsi.pipelines.study.tasks import TaskConfig
from wsi.pipelines.train import metrics
from wsi.pipelines.train.splits import Split

log = logging.getLogger(__name__)

#: metrics.json keys of one run that are not the kind's figures
_RUN_KEYS = ("split", "kind", "best_epoch", "epochs_run", "note")


class _JsonView:
    """Read like the metrics.json mapping it is written as."""

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_json().get(key, default)


@dataclass(frozen=True)
class RunMetrics(_JsonView):
    """metrics.json of one run folder."""

    split: Literal["test", "val"]  # the split scored: val only when the test split came out empty
    kind: str  # the task kind (categorical, regression, survival, multi-target)
    best_epoch: int  # the epoch whose weights are best.safetensors
    epochs_run: int
    figures: dict[str, Any]  # the kind's figures with their intervals, and best_val_* (TaskKind's own)
    note: str = ""  # why the figures are not the test split's ("" when they are)

    @property
    def n(self) -> int:
        """Cases scored."""
        return int(self.figures.get("n", 0))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunMetrics:
        return cls(
            split=data["split"], kind=data["kind"], best_epoch=int(data["best_epoch"]),
            epochs_run=int(data["epochs_run"]), note=str(data.get("note", "")),
            figures={k: v for k, v in data.items() if k not in _RUN_KEYS},
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        head = {"split": self.split, "kind": self.kind}
        tail = {"best_epoch": self.best_epoch, "epochs_run": self.epochs_run}
        return {**head, **self.figures, **tail, **({"note": self.note} if self.note else {})}


@dataclass(frozen=True)
class FigureSummary:
    """One figure over the folds of a cross-validation (None: not estimable in enough folds)."""

    mean: float | None
    std: float | None  # ddof=1; None below two folds with a value
    folds: tuple[float | None, ...]


@dataclass(frozen=True)
class CvMetrics(_JsonView):
    """metrics.json at the top of a cross-validation run."""

    folds: int
    kind: str
    summary: dict[str, FigureSummary]  # the kind's summary figures (TaskKind.summary_keys), in order
    pooled: dict[str, Any]  # the kind's figures over every fold's test predictions together
    per_fold: tuple[RunMetrics, ...]

    def to_json(self) -> dict[str, Any]:
        means = {
            k: {"mean": s.mean, "std": s.std, "folds": list(s.folds)} for k, s in self.summary.items()
        }
        per_fold = [m.to_json() for m in self.per_fold]
        return {"folds": self.folds, "kind": self.kind, **means, "pooled": self.pooled, "per_fold": per_fold}


@dataclass(frozen=True)
class TrainResult(StageResult[JobResult]):
    """A trained run: `out_dir` is the run folder; no per-item rows (an unusable input refuses the whole
    run before training); with --cv, each fold's TrainResult in `folds`."""

    metrics: RunMetrics | CvMetrics = field(kw_only=True)  # metrics.json (CvMetrics atop --cv runs)
    config_path: Path = field(kw_only=True)
    best_checkpoint: Path | None = field(kw_only=True)  # None at the top of a cross-validation run
    kind: TaskKind = field(kw_only=True)  # the task kind (summary keys and lines; each fold fits its own)
    folds: list[TrainResult] = field(default_factory=list, kw_only=True)

    @classmethod
    def of(cls, run_dir: Path, metrics: RunMetrics | CvMetrics, best: Path | None, kind: TaskKind,
           folds: list[TrainResult] | None = None, seconds: float = 0.0) -> TrainResult:  # fmt: skip
        return cls("train", run_dir, (), seconds, metrics=metrics, config_path=record_path(run_dir),
                   best_checkpoint=best, kind=kind, folds=folds or [])  # fmt: skip

    @property
    def run_dir(self) -> Path:
        """The run folder (`out_dir`), as the other stages call it (`--model RUN_DIR`)."""
        return Path(self.out_dir)


def summarise_folds(
    run_dir: Path,
    task: TaskConfig,
    kind: TaskKind,
    splits: Sequence[Split],
    fold_metrics: Sequence[RunMetrics],
) -> TrainResult:
    """metrics.json (mean and std of each figure, every fold's, and the pooled test predictions'),
    folds.csv and the cross-validation report (per-fold and pooled curves) at the top."""
    fold_dirs = [run_dir / f"fold-{k + 1}" for k in range(len(splits))]
    sets = [
        kind.read_predictions(d / f"{m.split}_predictions.csv", f"fold-{k + 1}")
        for k, (d, m) in enumerate(zip(fold_dirs, fold_metrics, strict=True))
    ]
    pooled = PredictionSet.pool(sets)
    pooled_metrics = metrics.json_safe(kind.evaluate(pooled, n_bootstrap=task.bootstrap, seed=task.seed))
    per_fold = [m.to_json() for m in fold_metrics]
    summary = {
        key: FigureSummary(s["mean"], s["std"], tuple(s["folds"]))
        for key, s in metrics.summarize(per_fold, kind.summary_keys).items()
    }
    cv = CvMetrics(len(splits), kind.name, summary, pooled_metrics, tuple(fold_metrics))
    write_json_atomic(run_dir / "metrics.json", cv.to_json())
    fold_rows = (
        [sid, it.group, *kind.format_target(it.target), k + 1]
        for k, s in enumerate(splits)
        for it in s.test
        for sid in ([x for x, _ in it.slides] or [it.id])
    )
    write_csv_atomic(run_dir / "folds.csv", ["slide", "patient", *kind.target_names, "test_fold"], fold_rows)
    by_set = {s.name: m for s, m in zip(sets, per_fold, strict=True)} | {"pooled": pooled_metrics}
    summary_rows = [[key, summary[key].mean, summary[key].std] for key in kind.summary_keys]
    write_report(
        run_dir, kind=kind, sets=[*sets, pooled], metrics=by_set, summary=summary_rows, seed=task.seed,
        title=f"{task.name}: {len(splits)}-fold cross-validation",
    )  # fmt: skip
    head = summary[kind.summary_keys[0]]
    log.info(
        "cross-validation %s %s +- %s over %d folds (pooled: %s)",
        kind.summary_keys[0], head.mean, head.std, len(splits), kind.summary_line(pooled_metrics),
    )  # fmt: skip
    pairs = zip(fold_dirs, fold_metrics, strict=True)
    folds = [TrainResult.of(d, m, d / "best.safetensors", kind) for d, m in pairs]
    return TrainResult.of(run_dir, cv, None, kind, folds)


__all__ = ["CvMetrics", "FigureSummary", "RunMetrics", "TrainResult", "summarise_folds"]

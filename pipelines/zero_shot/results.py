"""What a zero-shot run returns: the stage result shape every stage shares, one row per slide.

`ZeroShotResult` is a `StageResult` (pipelines/scheduling/results.py): `results` holds one `SlideScore`
per input in input order, failures included (status, error), so `len`, iteration and `.problems` work as
for every stage; the scored rows carry each class's probability and pooled similarity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wsi.pipelines.scheduling.results import JobResult, StageResult


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.float32)


@dataclass
class SlideScore(JobResult):
    """One slide: JobResult's fields (`n` = tiles scored, 1 for a slide embedding) and, when scored, the
    class probabilities and the similarities they came from (in the result's `classes` order)."""

    probs: np.ndarray = field(default_factory=_empty)  # (C,)
    scores: np.ndarray = field(default_factory=_empty)  # (C,) top-k pooled (tile level) or slide cosines
    predicted: str = ""  # the class of highest probability ("" when not scored)


@dataclass(frozen=True)
class ZeroShotResult(StageResult[SlideScore]):
    """One row per slide in `results`; `predictions_csv` the table written; with labels, what metrics.json
    holds in `metrics`; `files` the heatmaps and QuPath files written."""

    model: str = field(default="", kw_only=True)
    classes: tuple[str, ...] = field(default=(), kw_only=True)
    predictions_csv: Path = field(default=Path(), kw_only=True)
    metrics: dict[str, Any] | None = field(default=None, kw_only=True)
    files: tuple[str, ...] = field(default=(), kw_only=True)

    @property
    def scored(self) -> tuple[SlideScore, ...]:
        """The slides that were scored, in input order."""
        return tuple(r for r in self.results if r.status == "ok")

    def probabilities(self) -> np.ndarray:
        """(S, C) class probabilities of the scored slides, in the order of `scored`."""
        rows = self.scored
        return np.stack([r.probs for r in rows]) if rows else np.zeros((0, len(self.classes)), np.float32)

    def predicted(self) -> dict[str, str]:
        """slide id -> predicted class, for the scored slides."""
        return {r.slide_id: r.predicted for r in self.scored}


__all__ = ["SlideScore", "ZeroShotResult"]

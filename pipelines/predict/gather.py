"""Where a prediction's inputs come from, checked before any work and gathered into one mapping.

A run reads one kind of input (`RunModel.adapter`: bags, slide embeddings, images); what `predict` is
given (slide paths or `--features DIR`) and that kind decide the route (`InputRoute`): inputs made
already are read as they are; raw slides are tiled and embedded with the run's recorded settings
(and, for a run on slide embeddings, embedded again by its slide encoder); images are read directly.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from wsi.core.errors import ConfigError
from wsi.pipelines.predict.config import PredictOptions
from wsi.pipelines.predict.raw_slide_embeddings import embed_raw_slides_to_embeddings
from wsi.pipelines.predict.raw_slides import embed_raw_slides
from wsi.pipelines.predict.run_model import RunModel
from wsi.pipelines.scheduling.results import JobResult

#: input names (pipelines.inputs registry) whose inputs an encoder makes from raw slides
BAGS, SLIDE_EMBEDDINGS = "bags", "slide-embeddings"


class InputRoute(enum.Enum):
    """How the cases to predict are found."""

    GIVEN = "given"  # --features: bags or embeddings made already, read as they are
    SLIDES_TO_BAGS = "slides-to-bags"  # raw slides tiled and embedded as the run recorded
    SLIDES_TO_EMBEDDINGS = "slides-to-embeddings"  # ... then the run's slide encoder
    DIRECT = "direct"  # the run reads its inputs itself (images, volumes): no encoder

    @classmethod
    def of(cls, input_name: str, features_dir: str | Path | None) -> InputRoute:
        if features_dir is not None:
            return cls.GIVEN
        by_input = {BAGS: cls.SLIDES_TO_BAGS, SLIDE_EMBEDDINGS: cls.SLIDES_TO_EMBEDDINGS}
        return by_input.get(input_name, cls.DIRECT)

    @property
    def embeds(self) -> bool:
        """Whether an encoder runs (what --weights are for)."""
        return self in (InputRoute.SLIDES_TO_BAGS, InputRoute.SLIDES_TO_EMBEDDINGS)


@dataclass
class Gathered:
    """The cases found, with the slides behind them and what failed on the way."""

    found: dict[str, Path]  # case id -> its input file
    thumbs: dict[str, tuple[Path, float | None]] = field(default_factory=dict)  # slide -> (path, mpp)
    failed: list[JobResult] = field(default_factory=list)  # slides that failed or were empty


def check_request(
    inputs: Sequence[str | Path], features_dir: str | Path | None, opts: PredictOptions
) -> None:
    """Refuse what cannot be right whatever the run: before the run is loaded."""
    if bool(inputs) == (features_dir is not None):
        raise ConfigError("give either slides (PATH...) or --features DIR, not both and not neither")
    if opts.weights is not None and features_dir is not None:
        raise ConfigError(
            "--weights are the encoder's weights for embedding raw slides; bags given with --features are "
            "embedded already: leave --weights out"
        )
    if opts.labels_csv is not None and not Path(opts.labels_csv).is_file():
        raise ConfigError(f"--labels {opts.labels_csv} does not exist")


def check_route(run: RunModel, route: InputRoute, opts: PredictOptions) -> None:
    """Refuse options this run's route has no use for."""
    if opts.weights is not None and route is InputRoute.DIRECT:
        raise ConfigError(
            f"--weights are for the encoder that embeds raw slides; this run reads {run.adapter.name} "
            "directly, with no encoder: leave --weights out"
        )


def gather(
    run: RunModel, route: InputRoute, inputs: Sequence[str | Path], features_dir: str | Path | None,
    work: Path, opts: PredictOptions,
) -> Gathered:  # fmt: skip
    """The cases of `route`; raw slides are tiled and embedded into `work`."""
    if route is InputRoute.GIVEN:
        return Gathered(run.adapter.find([Path(str(features_dir))]))
    if route is InputRoute.DIRECT:
        return Gathered(run.adapter.find([Path(p) for p in inputs]))
    if route is InputRoute.SLIDES_TO_EMBEDDINGS:  # no slide heatmaps: one vector a slide
        found, _, failed = embed_raw_slides_to_embeddings(run.provenance, inputs, work, opts)
        return Gathered(found, {}, failed)
    found, thumbs, failed = embed_raw_slides(run.provenance, inputs, work, opts)
    return Gathered(found, thumbs, failed)


__all__ = ["BAGS", "SLIDE_EMBEDDINGS", "Gathered", "InputRoute", "check_request", "check_route", "gather"]

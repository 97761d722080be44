"""`wsi tile` options for segmentation networks (issue 20): not config fields (TileParams, TileOptions),
as they name files whose content (sha256) the tile file records."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from wsi.cli._options import FiniteFloatRange

F = TypeVar("F", bound=Callable[..., Any])

#: shown in --help; the library's registry (models.segmentation.named) is the truth, checked by a test
TISSUE_MODELS = ("grandqc-tissue", "hest-tissue")
ARTIFACT_MODELS = ("grandqc-artifact", "grandqc-artifact-mpp15", "grandqc-artifact-mpp2")


def model_options() -> Callable[[F], F]:
    """--tissue-model/--tissue-weights, --artifact-model/--artifact-weights, --max-artifact, --device."""
    weights = click.Path(path_type=Path, dir_okay=False)
    options = [
        click.option(
            "--tissue-model", type=click.Choice(TISSUE_MODELS), default=None,
            help="Tissue mask from this network (GrandQC's at 10 um/px, HEST's at 1 um/px) instead of "
            "saturation + Otsu; needs --tissue-weights.",
        ),
        click.option(
            "--tissue-weights", type=weights, default=None,
            help="Its weights: GrandQC's Tissue_Detection_MPP10.pth or HEST's deeplabv3_seg_v4.ckpt.",
        ),
        click.option(
            "--artifact-model", type=click.Choice(ARTIFACT_MODELS), default=None,
            help="Reject tiles covered by GrandQC's artifacts (fold, dark spot, pen, edge and air bubble, "
            "out of focus), run at 1 um/px (-mpp15: 1.5, -mpp2: 2); needs --artifact-weights.",
        ),
        click.option(
            "--artifact-weights", type=weights, default=None,
            help="Its weights as a state dict (TRIDENT's GrandQC_MPP1_state_dict.pth); GrandQC's own .pth "
            "files are pickled models and are refused.",
        ),
        click.option(
            "--max-artifact", type=FiniteFloatRange(0, 1), default=0.25, show_default=True,
            help="Reject a tile when more than this share of it is artifact (with --artifact-model).",
        ),
        click.option(
            "--device", default="auto", show_default=True,
            help="Where the segmentation networks run: auto (CUDA, MPS, else CPU), cpu, cuda, cuda:N, mps.",
        ),
    ]  # fmt: skip

    def apply(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


def segmentation_from(
    tissue_model: str | None,
    tissue_weights: Path | None,
    artifact_model: str | None,
    artifact_weights: Path | None,
    max_artifact: float,
    device: str,
) -> Any:
    """The tile stage's SegmentationOptions (imported here: `wsi tile --help` stays instant)."""
    from wsi.pipelines.tile.segment import SegmentationOptions

    return SegmentationOptions(
        tissue_model=tissue_model, artifact_model=artifact_model, max_artifact_fraction=max_artifact,
        tissue_weights=tissue_weights.absolute() if tissue_weights else None,  # the same file for workers
        artifact_weights=artifact_weights.absolute() if artifact_weights else None, device=device,
    )  # fmt: skip

"""Zero-shot classification and retrieval with the vision-language towers (models/text_encoders).

zero_shot(inputs, *, out_dir, prompts, tower=None, options=None | **ZeroShotOptions fields) -> ZeroShotResult
    (a StageResult: one SlideScore row per slide, .scored, .probabilities(), .predicted(), .metrics)
    predictions.csv (prob_<class>, predicted, pooled similarities), manifest.csv, heatmaps/, geojson/,
    text_embeddings/ (the prompt set's embeddings, cached), with labels metrics.json + report.html
retrieve(inputs, *, out_dir, query=None | query_tile=(slide, x_um, y_um), ...) -> RetrievalResult
    the tiles of a cohort most like a text or a tile: top_tiles.csv and pictures
PromptSet, load_prompts(path | name, default_templates), ZeroShotOptions
"""

from wsi.pipelines.zero_shot.config import ZeroShotOptions
from wsi.pipelines.zero_shot.inputs import InputRefused
from wsi.pipelines.zero_shot.prompts import PromptSet, load_prompts
from wsi.pipelines.zero_shot.results import SlideScore, ZeroShotResult
from wsi.pipelines.zero_shot.retrieval import RetrievalResult, retrieve
from wsi.pipelines.zero_shot.stage import zero_shot

__all__ = [
    "InputRefused",
    "PromptSet",
    "RetrievalResult",
    "SlideScore",
    "ZeroShotOptions",
    "ZeroShotResult",
    "load_prompts",
    "retrieve",
    "zero_shot",
]

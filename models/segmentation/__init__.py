"""Tissue and artifact segmentation networks from the user's weights (GrandQC, HEST)."""

from wsi.models.segmentation.named import SEGMENTERS, SegmenterSpec, segmenter_spec
from wsi.models.segmentation.run import Segmenter, load_segmenter

__all__ = ["SEGMENTERS", "Segmenter", "SegmenterSpec", "load_segmenter", "segmenter_spec"]

"""A segmentation network with the user's weights, run on RGB windows at its training resolution.

    load_segmenter(name, weights, kind, device) -> Segmenter    # key-checked, sha256 of the file
    Segmenter.classify(windows (B, P, P, 3) uint8) -> (B, P, P) int64 class per pixel

The weights are read as tensors only (`models.encoders.weights.load_state_dict_file`) and loaded all or
nothing: missing, unexpected and wrongly shaped tensors are listed by name.
"""

from __future__ import annotations

import io
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from wsi.core.errors import WeightsError
from wsi.core.files import sha256_file
from wsi.formats.tile_meta import SegmentationModel
from wsi.models.encoders.weights import load_all_or_nothing, load_state_dict_file
from wsi.models.segmentation.named import IMAGENET_MEAN, IMAGENET_STD, SegKind, SegmenterSpec, segmenter_spec

log = logging.getLogger(__name__)

#: windows per forward pass
BATCH = 4


def jpeg_round_trip(rgb: np.ndarray, quality: int) -> np.ndarray:
    """(H, W, 3) uint8 after a JPEG encode/decode at `quality`, as GrandQC's tissue detector does it.

    GrandQC hands the RGB array to `cv2.imencode`, which takes it for BGR: the colour transform and
    chroma subsampling see R and B swapped. Reversing the channels around PIL's encoder reproduces that.
    """
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb[..., ::-1])).save(buf, format="JPEG", quality=quality)
    buf.seek(0)
    return np.asarray(Image.open(buf).convert("RGB"))[..., ::-1].copy()


@dataclass
class Segmenter:
    """A loaded network, its spec, the weights' file and sha256, and the device it runs on."""

    spec: SegmenterSpec
    net: nn.Module
    weights: Path
    sha256: str
    device: torch.device

    def describe(self) -> SegmentationModel:
        """What the tile file records about the model."""
        return {
            "name": self.spec.name,
            "weights": str(self.weights),
            "sha256": self.sha256,
            "mpp": self.spec.mpp,
        }

    def preprocess(self, windows: np.ndarray) -> torch.Tensor:
        """(B, P, P, 3) uint8 -> (B, 3, P, P) float32, normalised as the network was trained."""
        if self.spec.jpeg_quality is not None:
            windows = np.stack([jpeg_round_trip(w, self.spec.jpeg_quality) for w in windows])
        x = (
            torch.from_numpy(np.ascontiguousarray(windows)).to(self.device).permute(0, 3, 1, 2).float()
            / 255.0
        )
        mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=self.device).view(1, 3, 1, 1)
        return (x - mean) / std

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out["out"] if self.spec.dict_output else out

    def classify(self, windows: np.ndarray) -> np.ndarray:
        """(B, P, P) int64 class of every pixel of (B, P, P, 3) uint8 windows."""
        parts = []
        for start in range(0, len(windows), BATCH):
            logits = self.logits(self.preprocess(windows[start : start + BATCH])).float()
            if self.spec.decision == "softmax1":
                cls = (torch.softmax(logits, dim=1)[:, 1] > 0.5).long()
            else:
                cls = logits.argmax(dim=1)
            parts.append(cls.cpu().numpy())
        return np.concatenate(parts) if parts else np.zeros((0, 0, 0), np.int64)


def load_segmenter(
    name: str, weights: str | os.PathLike[str], *, kind: SegKind, device: torch.device | None = None
) -> Segmenter:
    """The `kind` network `name` with the checked weights of `weights`, in eval mode on `device`."""
    spec = segmenter_spec(name, kind)
    path = Path(weights)
    hint = f" ({spec.weights_hint})" if spec.weights_hint else ""
    try:
        state = spec.key_layout(load_state_dict_file(path))
    except WeightsError as exc:
        raise WeightsError(f"{kind} model {name!r}: {exc}{hint}") from None
    net = spec.build()
    load_all_or_nothing(net, state, path=path, what=f"{kind} model {name!r}", hint=hint)
    device = device or torch.device("cpu")
    net.to(device).eval()
    digest = sha256_file(path)
    log.info("%s model %s from %s (sha256 %s) on %s", kind, name, path, digest[:12], device)
    return Segmenter(spec, net, path, digest, device)


__all__ = ["BATCH", "Segmenter", "jpeg_round_trip", "load_segmenter"]

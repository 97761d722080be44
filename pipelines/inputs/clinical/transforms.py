"""From an `ImageData` to the model's input tensor: channels, intensity, then size.

Intensity is normalized before the geometry so that padding with 0 means "average" in every mode:
  imagenet  values to [0, 1] (by the known range, else the 0.5/99.5 percentiles), then ImageNet mean/std
            per channel: colour photographs (dermoscopy, fundus).
  range     values to [0, 1] the same way, then to [-1, 1]: radiographs, whose scale the file defines.
  zscore    zero mean and unit variance per image, clipped at +/-5 sd: MRI, whose units are arbitrary.
2D images are resized (antialiased bilinear) to the task's size. Volumes are resampled to the task's
voxel spacing where both are known (per axis), otherwise resized, and then centre-cropped or padded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from wsi.core.config import config_model
from wsi.core.errors import ConfigError, ImageReadError
from wsi.pipelines.inputs.clinical.formats import ImageData

Normalize = Literal["imagenet", "range", "zscore"]
NORMALIZE_MODES: tuple[str, ...] = ("imagenet", "range", "zscore")
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R BT.601, as Pillow's "L"
_ZSCORE_CLIP = 5.0
MAX_IMAGE_PX = 4096  # a side of the model's input image (input_options.size_px)


@config_model
@dataclass(frozen=True)
class ImageSpec:
    """What the model takes: shape, channels, intensity scale, and (3D) voxel spacing."""

    size_px: tuple[Annotated[int, Field(ge=1, le=MAX_IMAGE_PX)], ...]  # (H, W) or (D, H, W)
    channels: Annotated[int, Field(ge=1, le=3)] = 3
    normalize: Normalize = "imagenet"
    spacing_mm: tuple[Annotated[float, Field(gt=0, le=1000)], ...] | None = (
        None  # target voxel spacing (D, H, W); 3D only
    )

    def __post_init__(self) -> None:
        if len(self.size_px) not in (2, 3) or any(int(s) < 1 for s in self.size_px):
            raise ConfigError(f"image size {self.size_px} must be (H, W) or (D, H, W) of positive ints")
        if self.channels not in (1, 3):
            raise ConfigError(f"channels must be 1 or 3, not {self.channels}")
        if self.normalize not in NORMALIZE_MODES:
            raise ConfigError(f"normalize {self.normalize!r} unknown; one of {', '.join(NORMALIZE_MODES)}")
        if self.spacing_mm is not None and (
            len(self.spacing_mm) != len(self.size_px) or any(float(s) <= 0 for s in self.spacing_mm)
        ):
            raise ConfigError(f"spacing_mm {self.spacing_mm} must give one positive value per axis")

    @property
    def spatial_dims(self) -> int:
        return len(self.size_px)


def to_channels(pixels: np.ndarray, channels: int, *, path: object = "") -> np.ndarray:
    """(..., C) -> (..., channels): RGB to luma, other stacks averaged; gray repeated for 3."""
    have = pixels.shape[-1]
    if have == channels:
        return pixels
    if channels == 1:
        if have == 3:
            return (pixels @ _LUMA)[..., None]
        return pixels.mean(axis=-1, keepdims=True)
    if have == 1:
        return np.repeat(pixels, channels, axis=-1)
    raise ImageReadError(f"{path}: image has {have} channels; the task takes {channels}")


def _unit_range(pixels: np.ndarray, value_range: tuple[float, float] | None) -> np.ndarray:
    if value_range is not None and value_range[1] > value_range[0]:
        lo, hi = value_range
    else:
        lo, hi = (float(v) for v in np.percentile(pixels, (0.5, 99.5)))
        if hi <= lo:
            hi = lo + 1.0  # a flat image stays flat
    return np.clip((pixels - lo) / (hi - lo), 0.0, 1.0)


def normalize_intensity(
    pixels: np.ndarray, mode: Normalize, value_range: tuple[float, float] | None = None
) -> np.ndarray:
    """Channel-last float32 pixels to the scale the task's model expects (see module docstring)."""
    if mode == "zscore":
        mu, sd = float(pixels.mean()), float(pixels.std())
        out = (pixels - mu) / max(sd, 1e-6)
        return np.clip(out, -_ZSCORE_CLIP, _ZSCORE_CLIP).astype(np.float32)
    unit = _unit_range(pixels, value_range)
    if mode == "range":
        return (unit * 2.0 - 1.0).astype(np.float32)
    channels = pixels.shape[-1]
    if channels == 3:
        mean, std = np.array(_IMAGENET_MEAN, np.float32), np.array(_IMAGENET_STD, np.float32)
    else:  # gray: the channel average, so a gray image and its RGB copy look alike to the model
        mean = np.full(channels, np.mean(_IMAGENET_MEAN), np.float32)
        std = np.full(channels, np.mean(_IMAGENET_STD), np.float32)
    return ((unit - mean) / std).astype(np.float32)


def center_crop_or_pad(x: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """Crop or zero-pad the trailing len(size) axes of `x` around their centre."""
    nd = len(size)
    pad: list[int] = []
    slices: list[slice] = [slice(None)] * (x.ndim - nd)
    for have, want in zip(x.shape[-nd:], size, strict=True):
        if have >= want:
            start = (have - want) // 2
            slices.append(slice(start, start + want))
            pad_before = pad_after = 0
        else:
            slices.append(slice(None))
            pad_before = (want - have) // 2
            pad_after = want - have - pad_before
        pad = [pad_before, pad_after, *pad]  # F.pad wants the last axis first
    x = x[tuple(slices)]
    if any(pad):
        x = F.pad(x, pad, value=0.0)
    return x


def _resize(x: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """(C, *spatial) resized to `size`; antialiased when shrinking a 2D image."""
    if tuple(x.shape[1:]) == tuple(size):
        return x
    if len(size) == 2:
        return F.interpolate(x[None], size=size, mode="bilinear", align_corners=False, antialias=True)[0]
    return F.interpolate(x[None], size=size, mode="trilinear", align_corners=False)[0]


def resample_size(
    shape: tuple[int, ...],
    size: tuple[int, ...],
    src_mm: tuple[float, ...] | None,
    dst_mm: tuple[float, ...] | None,
) -> tuple[int, ...]:
    """Per axis: the size at the target spacing where both spacings are known, else the task's size."""
    out = []
    for i, (n, want) in enumerate(zip(shape, size, strict=True)):
        if src_mm is not None and dst_mm is not None and math.isfinite(src_mm[i]) and src_mm[i] > 0:
            out.append(max(1, round(n * src_mm[i] / dst_mm[i])))
        else:
            out.append(want)
    return tuple(out)


def prepare(data: ImageData, spec: ImageSpec) -> torch.Tensor:
    """The model input for one image: (C, H, W) or (C, D, H, W) float32."""
    if data.spatial_dims != spec.spatial_dims:
        raise ImageReadError(f"{data.path}: {data.spatial_dims}D image for a {spec.spatial_dims}D task")
    pixels = to_channels(data.pixels, spec.channels, path=data.path)
    pixels = normalize_intensity(pixels, spec.normalize, data.value_range)
    x = torch.from_numpy(np.ascontiguousarray(np.moveaxis(pixels, -1, 0)))  # (..., C) -> (C, ...)
    if spec.spatial_dims == 2:
        return _resize(x, spec.size_px).contiguous()
    target = resample_size(tuple(x.shape[1:]), spec.size_px, data.spacing_mm, spec.spacing_mm)
    return center_crop_or_pad(_resize(x, target), spec.size_px).contiguous()

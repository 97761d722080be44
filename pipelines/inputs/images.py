"""The image input adapter: radiographs, dermoscopy, fundus photos and MRI volumes for vit-2d / vit-3d.

Task YAML:

    input: images
    input_options:
      size_px: 224            # 2D: an int or [H, W]; 3D: [D, H, W]
      channels: 3             # 1 or 3 (gray is repeated, colour turned to luma as needed)
      normalize: imagenet     # imagenet | range | zscore (see wsi.pipelines.inputs.clinical.transforms)
      spacing_mm: null        # 3D: target voxel spacing [D, H, W] when the file gives its own
      augment: true           # the paper's augmentation while training (2D rotate + flip, 3D flips)
      projection: mid         # 3D heatmaps: middle slice (mid) or maximum-intensity projection (max)

Ids are file names without their suffix (for a DICOM series of a 3D task: the folder name), matched
against the label table's image column.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch.utils.data import Dataset

from wsi.core.errors import ConfigError, ImageReadError
from wsi.core.files import is_temp_name, sanitize_slide_id
from wsi.core.json_types import JsonObject, JsonValue
from wsi.pipelines.inputs import INPUTS, Batch, DataModelKwargs, Item
from wsi.pipelines.inputs.clinical.dataset import ImageDataset, collate_images
from wsi.pipelines.inputs.clinical.heatmap import fit_long_side, save_heatmap
from wsi.pipelines.inputs.clinical.readers import (
    DICOM_SUFFIXES,
    IMAGE_SUFFIXES,
    NIFTI_SUFFIXES,
    PHOTO_SUFFIXES,
    image_suffix,
    probe_image,
    read_image,
)
from wsi.pipelines.inputs.clinical.transforms import NORMALIZE_MODES, ImageSpec
from wsi.pipelines.inputs.samples import Sample

log = logging.getLogger(__name__)

_PREFERRED_PATCH = (4, 16, 16)  # the vit-3d / vit-2d presets' patches, used to read a token grid
_SPEC_KEYS = ("size_px", "channels", "normalize", "spacing_mm")
_HEATMAP_MAX_PX = 1024


def image_id(path: Path) -> str:
    """The id a label table names an image by: its file name without the (image) suffix."""
    suffix = image_suffix(path)
    known = suffix in IMAGE_SUFFIXES and not path.is_dir()  # a series folder keeps its whole name
    return sanitize_slide_id(path.name[: -len(suffix)] if known else path.name)


@INPUTS.register("images")
class ImageInput:
    """`input: images`; options as in the module docstring (unknown ones raise ConfigError)."""

    name: ClassVar[str] = "images"
    source_option: ClassVar[str] = "--images"

    def __init__(
        self,
        *,
        size_px: int | Sequence[int] = 224,
        channels: int = 3,
        normalize: str = "imagenet",
        spacing_mm: Sequence[float] | None = None,
        augment: bool = True,
        projection: str = "mid",
    ) -> None:
        size = _size_tuple(size_px)
        if normalize not in NORMALIZE_MODES:
            raise ConfigError(
                f"input_options.normalize {normalize!r}: use one of {', '.join(NORMALIZE_MODES)}"
            )
        if projection not in ("mid", "max"):
            raise ConfigError(f"input_options.projection {projection!r}: use 'mid' or 'max'")
        spacing = tuple(float(s) for s in spacing_mm) if spacing_mm is not None else None
        self.spec = ImageSpec(size_px=size, channels=int(channels), normalize=normalize, spacing_mm=spacing)  # type: ignore[arg-type]
        self.augment = bool(augment)
        self.projection = projection

    # -- finding files -------------------------------------------------------------------------

    def find(self, sources: Sequence[Path]) -> dict[str, Path]:
        """Every image file under the sources (folders searched recursively); unreadable ones logged.

        For 3D tasks a folder holding two or more DICOM files is one volume (a series), named by the
        folder; for 2D tasks every DICOM file is an image of its own.
        """
        found: dict[str, Path] = {}
        bad: list[str] = []
        for source in map(Path, sources):
            if source.is_dir():
                files = _image_files(source)
                if not files:
                    raise ConfigError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {source}")
                if self.spec.spatial_dims == 3:
                    files = _group_dicom_series(files)
            elif source.is_file() and image_suffix(source) in IMAGE_SUFFIXES:
                files = [source]
            else:
                raise ConfigError(
                    f"{source} is neither a folder of images nor an image file ({', '.join(IMAGE_SUFFIXES)})"
                )
            for path in files:
                try:
                    probe_image(path)
                except ImageReadError as exc:
                    log.error("skipping unreadable image %s: %s", path, exc)
                    bad.append(str(path))
                    continue
                key = image_id(path)
                if key in found and found[key] != path:
                    raise ConfigError(f"two images with id {key!r}: {found[key]} and {path}; rename one")
                found[key] = path
        if bad:
            log.warning("%d unreadable image(s) left out, e.g. %s", len(bad), bad[0])
        return found

    # -- data -----------------------------------------------------------------------------------

    def dataset(self, items: Sequence[Item], *, train: bool) -> Dataset[Sample]:
        rows = [(it.path, it.label, it.id) for it in items]
        return ImageDataset(rows, self.spec, augment=train and self.augment)

    def collate(self, samples: list[Sample]) -> Batch:
        """Stack images; unreadable ones are dropped (logged by path), so a batch may come out smaller.

        A batch with no readable image raises `ImageReadError` naming the files (predict records it as
        that image's failure)."""
        x, labels, ids = collate_images(samples)
        return Batch(x=x, labels=labels, ids=ids)

    def model_kwargs(self, items: Sequence[Item]) -> DataModelKwargs:
        return {"in_channels": self.spec.channels}

    # -- provenance -----------------------------------------------------------------------------

    def _spec_dict(self) -> JsonObject:
        s = self.spec
        return {
            "size_px": list(s.size_px),
            "channels": s.channels,
            "normalize": s.normalize,
            "spacing_mm": list(s.spacing_mm) if s.spacing_mm else None,
        }

    def provenance(self, items: Sequence[Item]) -> JsonObject:
        """The input geometry and scale the model was trained on, and the file types it saw."""
        formats = Counter(image_suffix(it.path) for it in items)
        return {
            **self._spec_dict(),
            "spatial_dims": self.spec.spatial_dims,
            "formats": dict(sorted(formats.items())),
        }

    def check_compatible(self, provenance: Mapping[str, JsonValue], items: Sequence[Item]) -> None:
        """Refuse to predict with another input geometry/scale, or 2D files for a 3D model (and back)."""
        mine = self._spec_dict()
        diff = [
            f"{k} {mine[k]} != trained {provenance[k]}"
            for k in _SPEC_KEYS
            if k in provenance and provenance[k] != mine[k]
        ]
        if diff:
            raise ConfigError("images would be prepared differently from training: " + "; ".join(diff))
        if self.spec.spatial_dims == 2:
            wrong = [
                it.path.name for it in items if image_suffix(it.path) in NIFTI_SUFFIXES or it.path.is_dir()
            ]
            if wrong:
                raise ConfigError(f"the model takes 2D images, but got volumes: {', '.join(wrong[:5])}")
        else:
            wrong = [it.path.name for it in items if image_suffix(it.path) in PHOTO_SUFFIXES]
            if wrong:
                raise ConfigError(f"the model takes volumes, but got 2D pictures: {', '.join(wrong[:5])}")

    # -- heatmaps -------------------------------------------------------------------------------

    def heatmap(
        self,
        item: Item,
        sample: Sample,
        contributions: torch.Tensor,
        out_png: Path,
        title: str = "",
        grid_shape: Sequence[int] | None = None,
    ) -> None:
        """Per-patch values (N,) over the image: 2D over the original picture (the patch grid stretched
        back onto it, longer side at most 1,024 px), 3D over the volume the model saw (`projection`)."""
        x = sample["x"]  # (C, H, W) | (C, D, H, W)
        values = contributions.detach().float().cpu().numpy().reshape(-1)
        grid = tuple(grid_shape) if grid_shape is not None else infer_grid(tuple(x.shape[1:]), values.size)
        image = np.moveaxis(x.detach().float().cpu().numpy(), 0, -1)  # channel last for display
        if self.spec.spatial_dims == 2:
            try:
                image = fit_long_side(read_image(item.path, spatial_dims=2).pixels, _HEATMAP_MAX_PX)
            except ImageReadError as exc:  # read fine a moment ago; fall back to the model's input
                log.warning("heatmap of %s drawn on the model input: %s", item.path, exc)
        save_heatmap(image, values, grid, out_png, projection=self.projection, title=title)  # type: ignore[arg-type]


def _size_tuple(size_px: object) -> tuple[int, ...]:
    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if is_int(size_px):
        return (size_px, size_px)  # type: ignore[return-value]
    if isinstance(size_px, list | tuple) and len(size_px) in (2, 3) and all(is_int(v) for v in size_px):
        return tuple(size_px)
    raise ConfigError(f"input_options.size_px must be an int or [H, W] or [D, H, W], not {size_px!r}")


def _image_files(folder: Path) -> list[Path]:
    """Image files under `folder`, skipping hidden and temporary names."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and image_suffix(p) in IMAGE_SUFFIXES
        and not is_temp_name(p)
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def _group_dicom_series(files: list[Path]) -> list[Path]:
    """Replace the DICOM files of every folder that has two or more by that folder (one series)."""
    per_folder = Counter(p.parent for p in files if image_suffix(p) in DICOM_SUFFIXES)
    series = {folder for folder, n in per_folder.items() if n >= 2}
    kept = [p for p in files if not (image_suffix(p) in DICOM_SUFFIXES and p.parent in series)]
    return sorted([*kept, *series])


def infer_grid(spatial: tuple[int, ...], n_tokens: int) -> tuple[int, ...]:
    """The patch grid of `n_tokens` over `spatial`, square in-plane patches; nearest the presets' patches."""
    candidates: list[tuple[float, tuple[int, ...]]] = []
    *depth, h, w = spatial
    for ph in range(1, min(h, w) + 1):
        if h % ph or w % ph:
            continue
        plane = (h // ph) * (w // ph)
        if n_tokens % plane:
            continue
        if not depth:
            if plane == n_tokens:
                candidates.append((abs(math.log(ph / _PREFERRED_PATCH[2])), (h // ph, w // ph)))
            continue
        gd = n_tokens // plane
        if gd and depth[0] % gd == 0:
            pd = depth[0] // gd
            cost = abs(math.log(ph / _PREFERRED_PATCH[2])) + abs(math.log(pd / _PREFERRED_PATCH[0]))
            candidates.append((cost, (gd, h // ph, w // ph)))
    if not candidates:
        raise ValueError(f"{n_tokens} patch tokens do not tile an input of {spatial}")
    return min(candidates)[1]

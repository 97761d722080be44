"""Radiology, dermoscopy and fundus images: readers, transforms, augmentation, dataset and heatmaps.

The image counterpart of tiles and bags: the same models, training loop and prediction code consume
these through `pipelines.inputs.images.ImageInput` (`input: images` in a task YAML).

  read_image(path, spatial_dims=2|3) -> ImageData     PNG/JPEG/TIFF, DICOM (+ series folders), NIfTI, .npy
  prepare(ImageData, ImageSpec) -> Tensor (C, ...)     channels, intensity normalization, resize/resample
  augment_2d / augment_3d(x, generator)                the paper's rotation + flip / per-axis flips
  ImageDataset(rows, spec, augment=...)                (path, label, id) rows -> samples; bad files skipped
  save_heatmap(image, contributions, grid, out_png)    per-patch contributions as a PNG
"""

from wsi.core.suffixes import IMAGE_SUFFIXES
from wsi.pipelines.inputs.clinical.augment import augment_2d, augment_3d
from wsi.pipelines.inputs.clinical.dataset import ImageDataset, collate_images
from wsi.pipelines.inputs.clinical.formats import ImageData, MissingReaderError
from wsi.pipelines.inputs.clinical.heatmap import save_heatmap
from wsi.pipelines.inputs.clinical.readers import probe_image, read_image
from wsi.pipelines.inputs.clinical.transforms import ImageSpec, prepare

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageData",
    "ImageDataset",
    "ImageSpec",
    "MissingReaderError",
    "augment_2d",
    "augment_3d",
    "collate_images",
    "prepare",
    "probe_image",
    "read_image",
    "save_heatmap",
]

"""Radiology, dermoscopy and fundus images: readers, transforms, augmentation, dataset and heatmaps.

The image counterpart of tiles and bags: the same models, training loop and prediction code consume
these through `pipelines.inputs.images.ImageInput`.
"""

from wsi.images.readers import IMAGE_SUFFIXES, ImageData, MissingReaderError, probe_image, read_image

__all__ = ["IMAGE_SUFFIXES", "ImageData", "MissingReaderError", "probe_image", "read_image"]

"""What image readers share: `ImageData`, the missing-reader error, suffix helpers (table: wsi.core.suffixes).

Pixels come in one layout whatever the file: 2D images (H, W, C), volumes (D, H, W, C), float32,
channel last. `value_range` is the range the values are known to span (photos [0, 1], a windowed DICOM
[0, 1], the stored-bit range of an unwindowed DICOM whose data fills at least half of it, e.g. 8-bit
radiographs), or None when only the data can say (NIfTI, npy, an unwindowed 12/16-bit DICOM: its
stored-bit range, e.g. -32768..32767, is far wider than the data and would flatten the image).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wsi.core.errors import WsiError
from wsi.core.suffixes import DICOM_SUFFIXES

#: what to tell a user whose optional reader library is missing
INSTALL_HINT = "install the image extras: pip install 'wsi[images]'"


class MissingReaderError(WsiError):
    """An optional reader library (pydicom, nibabel) is not installed."""


@dataclass(frozen=True)
class ImageData:
    """Pixels of one image or volume, channel last, with what is known about their scale."""

    pixels: np.ndarray  # (H, W, C) or (D, H, W, C) float32
    path: Path
    spacing_mm: tuple[float, ...] | None = None  # per spatial axis, (H, W) or (D, H, W)
    value_range: tuple[float, float] | None = None

    @property
    def spatial_dims(self) -> int:
        return self.pixels.ndim - 1


def image_suffix(path: Path) -> str:
    """The reader-relevant suffix, lower case ('.nii.gz' counts as one)."""
    name = path.name.lower()
    if name.endswith(".nii.gz"):
        return ".nii.gz"
    return path.suffix.lower()


def has_dicom_preamble(path: Path) -> bool:
    """Whether `path` starts like a DICOM file (a 128-byte preamble, then `DICM`); many lack a suffix."""
    with open(path, "rb") as fh:
        head = fh.read(132)
    return len(head) == 132 and head[128:] == b"DICM"


def is_dicom(path: Path) -> bool:
    """A DICOM by suffix, or a suffix-less file with the DICOM preamble."""
    suffix = image_suffix(path)
    return suffix in DICOM_SUFFIXES or (suffix == "" and has_dicom_preamble(path))

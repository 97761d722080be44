"""Writing a DICOM whole-slide series from pixels: one VL Whole Slide Microscopy Image instance per level.

Why: tests and benchmarks need DICOM WSI series of known pixels, labelled right or wrong. Each level is a
TILED_FULL instance (DICOM PS3.3 A.32.8) of JPEG Baseline frames, which openslide 4 (libdicom) opens from
any of its files. Frames are encoded by Pillow as JFIF YCbCr with the given chroma subsampling, so the
series is correctly labelled with `photometric="YBR_FULL_422"`; `photometric="RGB"` writes the
mislabelled series some converters produce (wsi.slides.slide_colour reads it right). `stream="adobe-rgb"`
writes RGB frames (an Adobe APP14 marker with transform 0, 4:4:4) instead.

Needs pydicom 3 (`pip install 'wsi[images]'`).

Public API:
  write_dicom_series(folder, levels, *, mpp, photometric, tile_px, jpeg_quality, subsampling, stream)
      -> list[Path]     one `level<i>.dcm` per level, level 0 first
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image

from wsi.core.files import atomic_path

WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"
_SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}
_WHITE = 255


def _frames(pixels: np.ndarray, tile_px: int, quality: int, subsampling: str, stream: str) -> list[bytes]:
    """The level's frames in row-major order (TILED_FULL), edge frames padded with white glass."""
    h, w, _ = pixels.shape
    out = []
    for y in range(0, h, tile_px):
        for x in range(0, w, tile_px):
            frame = np.full((tile_px, tile_px, 3), _WHITE, np.uint8)
            part = pixels[y : y + tile_px, x : x + tile_px]
            frame[: part.shape[0], : part.shape[1]] = part
            if stream == "adobe-rgb":
                from imagecodecs import jpeg8_encode

                out.append(bytes(jpeg8_encode(frame, level=quality, colorspace="RGB", outcolorspace="RGB")))
                continue
            buf = io.BytesIO()
            Image.fromarray(frame).save(buf, "JPEG", quality=quality, subsampling=_SUBSAMPLING[subsampling])
            out.append(buf.getvalue())
    return out


def write_dicom_series(
    folder: str | Path,
    levels: Sequence[np.ndarray],
    *,
    mpp: float,
    photometric: Literal["YBR_FULL_422", "RGB"] = "YBR_FULL_422",
    tile_px: int = 256,
    jpeg_quality: int = 90,
    subsampling: Literal["4:4:4", "4:2:2", "4:2:0"] = "4:2:0",
    stream: Literal["jfif", "adobe-rgb"] = "jfif",
) -> list[Path]:
    """Write `levels` ((h, w, 3) uint8 RGB, level 0 first) as one series in `folder`; `mpp`: level 0 um/px."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.encaps import encapsulate
    from pydicom.sequence import Sequence as DicomSequence
    from pydicom.uid import UID, JPEGBaseline8Bit, generate_uid

    folder = Path(folder)
    study, series, frame_of_reference = generate_uid(), generate_uid(), generate_uid()
    width0 = levels[0].shape[1]
    paths = []
    for i, pixels in enumerate(levels):
        h, w, _ = pixels.shape
        level_mpp = mpp * width0 / w
        frames = _frames(pixels, tile_px, jpeg_quality, subsampling, stream)
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = UID(WSI_SOP_CLASS)
        meta.MediaStorageSOPInstanceUID = uid = generate_uid()
        meta.TransferSyntaxUID = JPEGBaseline8Bit
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = WSI_SOP_CLASS, uid
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
        ds.FrameOfReferenceUID = frame_of_reference
        ds.Modality, ds.InstanceNumber = "SM", i + 1
        ds.ImageType = [
            "ORIGINAL" if i == 0 else "DERIVED",
            "PRIMARY",
            "VOLUME",
            "NONE" if i == 0 else "RESAMPLED",
        ]
        ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.PlanarConfiguration = 3, photometric, 0
        ds.Rows = ds.Columns = tile_px
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
        ds.NumberOfFrames = len(frames)
        ds.TotalPixelMatrixColumns, ds.TotalPixelMatrixRows = w, h
        ds.TotalPixelMatrixFocalPlanes, ds.NumberOfOpticalPaths = 1, 1
        ds.DimensionOrganizationType = "TILED_FULL"
        ds.ImagedVolumeWidth, ds.ImagedVolumeHeight = w * level_mpp / 1000, h * level_mpp / 1000
        measures = Dataset()
        measures.PixelSpacing = [level_mpp / 1000, level_mpp / 1000]  # mm
        measures.SliceThickness = 0.0005
        shared = Dataset()
        shared.PixelMeasuresSequence = DicomSequence([measures])
        ds.SharedFunctionalGroupsSequence = DicomSequence([shared])
        ds.LossyImageCompression, ds.LossyImageCompressionMethod = "01", "ISO_10918_1"
        ds.PixelData = encapsulate(frames)
        ds["PixelData"].VR = "OB"
        path = folder / f"level{i}.dcm"
        with atomic_path(path) as tmp:
            ds.save_as(tmp, enforce_file_format=True)
        paths.append(path)
    return paths


__all__ = ["WSI_SOP_CLASS", "write_dicom_series"]

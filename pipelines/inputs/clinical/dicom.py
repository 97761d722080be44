"""DICOM: single files (one slice, multi-frame, colour) and folders of single-frame slices of one series.

Gray values go stored -> modality units (rescale slope/intercept) -> the file's VOI window or LUT ->
MONOCHROME1 inverted, so high is bright everywhere. Volumes are ordered along the slice normal
(inferior to superior for axial). pydicom is optional: without it a `MissingReaderError` says what to
install. Datasets are typed `Any`: pydicom ships no type information.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.errors import ImageReadError
from wsi.core.suffixes import DICOM_SUFFIXES
from wsi.pipelines.inputs.clinical.formats import (
    INSTALL_HINT,
    ImageData,
    MissingReaderError,
    has_dicom_preamble,
    image_suffix,
)

_MIN_FILL = 0.5  # an unwindowed image must span this fraction of its stored-bit range to be scaled by it


def import_pydicom() -> Any:
    """The pydicom module, or MissingReaderError with the install hint."""
    try:
        import pydicom
    except ImportError as exc:
        raise MissingReaderError(f"reading DICOM needs pydicom; {INSTALL_HINT}") from exc
    return pydicom


def probe_dicom(path: Path) -> None:
    """Read the header only (no pixels); pydicom's error when it is not a DICOM file."""
    import_pydicom().dcmread(path, stop_before_pixels=True)


def _load_dicom(path: Path) -> tuple[Any, np.ndarray]:
    """(dataset, stored pixels) of one DICOM file; ImageReadError naming it when unreadable."""
    pydicom = import_pydicom()
    try:
        ds = pydicom.dcmread(path)
    except Exception as exc:  # InvalidDicomError, EOFError, struct errors...: all mean "not this file"
        raise ImageReadError(f"{path}: not a readable DICOM file ({type(exc).__name__}: {exc})") from exc
    if "PixelData" not in ds:
        raise ImageReadError(f"{path}: DICOM without pixel data (a report or structured document?)")
    try:
        stored = ds.pixel_array
    except Exception as exc:  # missing decoder plugin, truncated or corrupt pixel data
        raise ImageReadError(
            f"{path}: cannot decode its pixel data ({type(exc).__name__}: {exc}); if the file is "
            "intact, install a decoder for its transfer syntax: pip install pylibjpeg "
            "pylibjpeg-libjpeg pylibjpeg-openjpeg"
        ) from exc
    return ds, stored


def read_dicom(path: Path) -> ImageData:
    """One DICOM file as a volume (1 or more frames, D, H, W, C); a single slice is (1, H, W, C)."""
    ds, stored = _load_dicom(path)
    frames = int(getattr(ds, "NumberOfFrames", 1) or 1)
    samples = int(getattr(ds, "SamplesPerPixel", 1) or 1)
    arr = stored.astype(np.float32)
    if samples == 1:
        arr = arr[..., None]  # channel last
    if frames == 1:
        arr = arr[None]  # (1, H, W, C): one-slice volume
    spacing = _dicom_spacing(ds)
    if samples > 1:  # colour: pydicom already converted YBR to RGB
        top = float(2 ** int(ds.BitsStored) - 1)
        return ImageData(arr / top, path, spacing, (0.0, 1.0))
    pixels, value_range, windowed = _gray_values(arr, ds)
    return ImageData(pixels, path, spacing, value_range if windowed else _filled_range(pixels, value_range))


def _gray_values(arr: np.ndarray, ds: Any) -> tuple[np.ndarray, tuple[float, float], bool]:
    """Stored values -> modality units (rescale) -> VOI window/LUT -> MONOCHROME1 inverted; also the
    range the values can reach and whether a window/LUT set it."""
    from pydicom.pixels import apply_modality_lut

    photometric = str(getattr(ds, "PhotometricInterpretation", "MONOCHROME2")).upper()
    arr = np.asarray(apply_modality_lut(arr, ds), dtype=np.float32)  # rescale slope/intercept -> units
    lo, hi = _modality_range(ds)
    windowed = _apply_voi(arr, ds)
    if windowed is not None:
        arr, lo, hi = windowed, 0.0, 1.0
    if photometric == "MONOCHROME1":  # low values are bright: flip so high = bright everywhere
        arr = (lo + hi) - arr
    return arr.astype(np.float32), (lo, hi), windowed is not None


def _filled_range(pixels: np.ndarray, value_range: tuple[float, float]) -> tuple[float, float] | None:
    """The stored-bit range if the data fills it (8-bit radiographs), else None: 12 bits of MR in a
    16-bit signed field would use ~3% of -32768..32767, so the transforms scale by the data instead."""
    lo, hi = value_range
    if pixels.size == 0 or hi <= lo:
        return None
    spread = float(pixels.max()) - float(pixels.min())
    return value_range if spread >= _MIN_FILL * (hi - lo) else None


def read_dicom_series(folder: Path) -> ImageData:
    """A folder of single-frame DICOM slices of one series -> (D, H, W, 1), slices ordered along the
    slice normal (inferior to superior for axial), each slice rescaled by its own slope/intercept and
    the series windowed by the first slice's window."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    files = [p for p in files if image_suffix(p) in DICOM_SUFFIXES or has_dicom_preamble(p)]
    if not files:
        raise ImageReadError(
            f"{folder} is a folder without DICOM files; give an image file or a series folder"
        )
    slices = [_load_dicom(p) for p in files]
    series = {str(getattr(ds, "SeriesInstanceUID", "")) for ds, _ in slices}
    if len(series) > 1:
        raise ImageReadError(f"{folder} holds {len(series)} DICOM series; put each series in its own folder")
    shapes = {stored.shape for _, stored in slices}
    if len(shapes) > 1 or len(next(iter(shapes))) != 2:
        raise ImageReadError(
            f"{folder}: slices differ in size or are not single-frame gray ({sorted(shapes)})"
        )
    order, between = _slice_order(slices)
    values = []
    value_range: tuple[float, float] = (0.0, 1.0)
    windowed = False
    first = slices[order[0]][0]
    for i in order:
        ds, stored = slices[i]
        for key in ("WindowCenter", "WindowWidth", "VOILUTFunction", "VOILUTSequence"):
            if key in first and key not in ds:  # one window for the whole volume
                ds[key] = first[key]
        pixels, value_range, windowed = _gray_values(stored.astype(np.float32), ds)
        values.append(pixels)
    spacing = _dicom_spacing(first)
    if spacing is not None:
        spacing = (between if math.isfinite(between) else spacing[0], spacing[1], spacing[2])
    volume = np.stack(values)[..., None]  # (D, H, W, 1)
    return ImageData(volume, folder, spacing, value_range if windowed else _filled_range(volume, value_range))


def _slice_order(slices: list[tuple[Any, np.ndarray]]) -> tuple[np.ndarray, float]:
    """(order of the slices, median distance between them in mm or NaN) along the slice normal, or by
    the scanner's instance numbers when a slice has no geometry."""
    positions = [_slice_position(ds) for ds, _ in slices]
    known = [p for p in positions if p is not None]
    if len(known) == len(positions):
        order = np.argsort(known, kind="stable")
        steps = np.diff(np.sort(np.asarray(known, dtype=np.float64)))
        between = float(np.median(steps)) if len(steps) and np.median(steps) > 0 else math.nan
        return order, between
    numbers = [int(getattr(ds, "InstanceNumber", 0) or 0) for ds, _ in slices]
    return np.argsort(numbers, kind="stable"), math.nan


def _slice_position(ds: Any) -> float | None:
    """Position of a slice along its normal (row x column direction), in mm."""
    position = getattr(ds, "ImagePositionPatient", None)
    orientation = getattr(ds, "ImageOrientationPatient", None)
    if position is None or orientation is None:
        return None
    normal = np.cross(np.asarray(orientation[:3], float), np.asarray(orientation[3:], float))
    return float(np.dot(normal, np.asarray(position, float)))


def _modality_range(ds: Any) -> tuple[float, float]:
    """The value range the stored bits can reach, after the rescale slope and intercept."""
    bits = int(ds.BitsStored)
    signed = int(getattr(ds, "PixelRepresentation", 0)) == 1
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    slope = float(getattr(ds, "RescaleSlope", 1.0) or 1.0)
    intercept = float(getattr(ds, "RescaleIntercept", 0.0) or 0.0)
    ends = sorted((lo * slope + intercept, hi * slope + intercept))
    return ends[0], ends[1]


def _first(value: Any) -> float:
    """WindowCenter/Width may be multi-valued; the first is the default view."""
    try:
        return float(value[0])
    except TypeError:
        return float(value)


def _apply_voi(arr: np.ndarray, ds: Any) -> np.ndarray | None:
    """The VOI LUT or window (PS3.3 C.11.2) mapped to [0, 1]; None when the file defines neither."""
    if "VOILUTSequence" in ds and len(ds.VOILUTSequence):
        from pydicom.pixels import apply_voi_lut

        item = ds.VOILUTSequence[0]
        out_bits = int(item.LUTDescriptor[2])
        indices = np.rint(arr).astype(np.int32)  # a LUT is indexed by (rescaled) integer values
        out = np.asarray(apply_voi_lut(indices, ds, prefer_lut=True), dtype=np.float32)
        return np.clip(out / float(2**out_bits - 1), 0.0, 1.0)
    if "WindowCenter" not in ds or "WindowWidth" not in ds:
        return None
    center, width = _first(ds.WindowCenter), _first(ds.WindowWidth)
    function = str(getattr(ds, "VOILUTFunction", "LINEAR") or "LINEAR").upper()
    if function == "SIGMOID":
        return (1.0 / (1.0 + np.exp(-4.0 * (arr - center) / width))).astype(np.float32)
    if function == "LINEAR_EXACT":
        return np.clip((arr - (center - width / 2)) / width, 0.0, 1.0)
    width = max(width, 1.0)  # LINEAR needs width >= 1
    if width == 1.0:
        return (arr > center - 0.5).astype(np.float32)
    return np.clip((arr - (center - 0.5)) / (width - 1.0) + 0.5, 0.0, 1.0)


def _dicom_spacing(ds: Any) -> tuple[float, float, float] | None:
    """(slice, row, column) spacing in mm; NaN slice spacing when the file does not say."""
    rows_cols = getattr(ds, "PixelSpacing", None) or getattr(ds, "ImagerPixelSpacing", None)
    if rows_cols is None:
        return None
    between = getattr(ds, "SpacingBetweenSlices", None) or getattr(ds, "SliceThickness", None)
    return (float(between) if between else math.nan, float(rows_cols[0]), float(rows_cols[1]))

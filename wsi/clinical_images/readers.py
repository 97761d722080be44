"""Readers for radiology, dermoscopy and fundus images: PNG/JPEG/TIFF, DICOM, NIfTI and NumPy `.npy`.

Every reader returns an `ImageData` in one layout so the transforms never care where pixels came from:
2D images are (H, W, C), volumes (D, H, W, C), float32, channel last. Row 0 is the top of the picture
(EXIF rotation applied); volumes are put in the radiological display order (slices inferior to
superior, rows anterior to posterior, columns patient right to left, as DICOM axial images); a folder
of single-frame DICOM slices is read as one volume, ordered along the slice normal.
`value_range` is the range the values are known to span (photos [0, 1], a windowed DICOM [0, 1], the
stored-bit range of an unwindowed DICOM whose data fills at least half of it, e.g. 8-bit radiographs),
or None when only the data can say (NIfTI, npy, an unwindowed 12/16-bit DICOM: its stored-bit range,
e.g. -32768..32767, is far wider than the data and would flatten the image).

pydicom and nibabel are optional (`pip install 'wsi[images]'`); a missing one raises
`MissingReaderError`, which a dataset does not mistake for one bad file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wsi.errors import ImageReadError, WsiError
from wsi.suffixes import DICOM_SUFFIXES, IMAGE_SUFFIXES, NIFTI_SUFFIXES, NPY_SUFFIXES, PHOTO_SUFFIXES

_INSTALL_HINT = "install the image extras: pip install 'wsi[images]'"


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


def read_image(path: str | Path, *, spatial_dims: int = 2) -> ImageData:
    """Read `path` as a 2D image (`spatial_dims=2`) or a volume (`spatial_dims=3`).

    Raises `ImageReadError` naming the file when it is missing, corrupt or of the wrong kind.
    """
    path = Path(path)
    if spatial_dims not in (2, 3):
        raise ValueError(f"spatial_dims must be 2 or 3, not {spatial_dims}")
    if not path.exists():
        raise ImageReadError(f"image {path} does not exist")
    suffix = image_suffix(path)
    if path.is_dir():
        data = _read_dicom_series(path)
    elif suffix in PHOTO_SUFFIXES:
        data = _read_photo(path)
    elif suffix in DICOM_SUFFIXES or (suffix == "" and _has_dicom_preamble(path)):
        data = _read_dicom(path)
    elif suffix in NIFTI_SUFFIXES:
        data = _read_nifti(path)
    elif suffix in NPY_SUFFIXES:
        data = _read_npy(path, spatial_dims)
    else:
        raise ImageReadError(
            f"{path}: unknown image type {suffix or '(no suffix)'!r}; supported: {', '.join(IMAGE_SUFFIXES)}"
        )
    return _fit_dims(data, spatial_dims)


def _fit_dims(data: ImageData, spatial_dims: int) -> ImageData:
    """Turn a single-slice volume (a one-frame DICOM) into a 2D image; refuse to call a slice a volume."""
    if data.spatial_dims == spatial_dims and not (spatial_dims == 3 and data.pixels.shape[0] == 1):
        return data
    if data.spatial_dims == 3 and spatial_dims == 2:
        if data.pixels.shape[0] != 1:
            raise ImageReadError(
                f"{data.path} is a volume of {data.pixels.shape[0]} slices; this task takes 2D images"
            )
        spacing = data.spacing_mm[1:] if data.spacing_mm else None
        return ImageData(data.pixels[0], data.path, spacing, data.value_range)
    raise ImageReadError(
        f"{data.path} is a 2D image; this task takes volumes (NIfTI, .npy, a multi-frame DICOM or a "
        "folder of DICOM slices)"
    )


def _has_dicom_preamble(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(132)
    return len(head) == 132 and head[128:] == b"DICM"


# --- photos ---------------------------------------------------------------------------------------


def _read_photo(path: Path) -> ImageData:
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img = ImageOps.exif_transpose(img)  # camera rotation tag -> rows top to bottom
            img.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ImageReadError(f"{path}: not a readable image ({exc})") from exc
    mode = img.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        arr = np.asarray(img, dtype=np.float32)[..., None] / 65535.0
        return ImageData(arr, path, None, (0.0, 1.0))
    if mode == "I":  # 32-bit integers: 16-bit PNGs on older Pillow; scale by what fits
        raw = np.asarray(img, dtype=np.float64)
        top = 65535.0 if raw.max() <= 65535 else float(raw.max())
        return ImageData((raw / top).astype(np.float32)[..., None], path, None, (0.0, 1.0))
    if mode == "F":
        return ImageData(np.asarray(img, dtype=np.float32)[..., None], path, None, None)
    if mode in ("1", "L", "LA"):
        img = img.convert("L")
    elif mode != "RGB":
        img = img.convert("RGB")  # palette, RGBA, CMYK, YCbCr
    arr = np.asarray(img, dtype=np.float32) / 255.0
    if arr.ndim == 2:
        arr = arr[..., None]  # (H, W) -> (H, W, 1)
    return ImageData(arr, path, None, (0.0, 1.0))


# --- DICOM ----------------------------------------------------------------------------------------


def _import_pydicom():  # type: ignore[no-untyped-def]
    try:
        import pydicom
    except ImportError as exc:
        raise MissingReaderError(f"reading DICOM needs pydicom; {_INSTALL_HINT}") from exc
    return pydicom


def _load_dicom(path: Path):  # type: ignore[no-untyped-def]
    """(dataset, stored pixels) of one DICOM file; ImageReadError naming it when unreadable."""
    pydicom = _import_pydicom()
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


def _read_dicom(path: Path) -> ImageData:
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


def _gray_values(arr: np.ndarray, ds) -> tuple[np.ndarray, tuple[float, float], bool]:  # type: ignore[no-untyped-def]
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


_MIN_FILL = 0.5  # an unwindowed image must span this fraction of its stored-bit range to be scaled by it


def _filled_range(pixels: np.ndarray, value_range: tuple[float, float]) -> tuple[float, float] | None:
    """The stored-bit range if the data fills it (8-bit radiographs), else None: 12 bits of MR in a
    16-bit signed field would use ~3% of -32768..32767, so the transforms scale by the data instead."""
    lo, hi = value_range
    if pixels.size == 0 or hi <= lo:
        return None
    spread = float(pixels.max()) - float(pixels.min())
    return value_range if spread >= _MIN_FILL * (hi - lo) else None


def _read_dicom_series(folder: Path) -> ImageData:
    """A folder of single-frame DICOM slices of one series -> (D, H, W, 1), slices ordered along the
    slice normal (inferior to superior for axial), each slice rescaled by its own slope/intercept and
    the series windowed by the first slice's window."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    files = [p for p in files if image_suffix(p) in DICOM_SUFFIXES or _has_dicom_preamble(p)]
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
    positions = [_slice_position(ds) for ds, _ in slices]
    if all(p is not None for p in positions):
        order = np.argsort(positions, kind="stable")
        steps = np.diff(np.sort(np.asarray(positions, dtype=np.float64)))
        between = float(np.median(steps)) if len(steps) and np.median(steps) > 0 else math.nan
    else:  # no geometry: the scanner's numbering
        order = np.argsort([int(getattr(ds, "InstanceNumber", 0) or 0) for ds, _ in slices], kind="stable")
        between = math.nan
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


def _slice_position(ds) -> float | None:  # type: ignore[no-untyped-def]
    """Position of a slice along its normal (row x column direction), in mm."""
    position = getattr(ds, "ImagePositionPatient", None)
    orientation = getattr(ds, "ImageOrientationPatient", None)
    if position is None or orientation is None:
        return None
    normal = np.cross(np.asarray(orientation[:3], float), np.asarray(orientation[3:], float))
    return float(np.dot(normal, np.asarray(position, float)))


def _modality_range(ds) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The value range the stored bits can reach, after the rescale slope and intercept."""
    bits = int(ds.BitsStored)
    signed = int(getattr(ds, "PixelRepresentation", 0)) == 1
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    slope = float(getattr(ds, "RescaleSlope", 1.0) or 1.0)
    intercept = float(getattr(ds, "RescaleIntercept", 0.0) or 0.0)
    ends = sorted((lo * slope + intercept, hi * slope + intercept))
    return ends[0], ends[1]


def _first(value) -> float:  # type: ignore[no-untyped-def]
    """WindowCenter/Width may be multi-valued; the first is the default view."""
    try:
        return float(value[0])
    except TypeError:
        return float(value)


def _apply_voi(arr: np.ndarray, ds) -> np.ndarray | None:  # type: ignore[no-untyped-def]
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


def _dicom_spacing(ds) -> tuple[float, float, float] | None:  # type: ignore[no-untyped-def]
    """(slice, row, column) spacing in mm; NaN slice spacing when the file does not say."""
    rows_cols = getattr(ds, "PixelSpacing", None) or getattr(ds, "ImagerPixelSpacing", None)
    if rows_cols is None:
        return None
    between = getattr(ds, "SpacingBetweenSlices", None) or getattr(ds, "SliceThickness", None)
    return (float(between) if between else math.nan, float(rows_cols[0]), float(rows_cols[1]))


# --- NIfTI ----------------------------------------------------------------------------------------


def _read_nifti(path: Path) -> ImageData:
    try:
        import nibabel as nib
    except ImportError as exc:
        raise MissingReaderError(f"reading NIfTI needs nibabel; {_INSTALL_HINT}") from exc
    try:
        img = nib.as_closest_canonical(nib.load(path))  # voxel axes -> (R, A, S) increasing
        data = np.asarray(img.get_fdata(dtype=np.float32))
        zooms = img.header.get_zooms()[:3]
    except (nib.filebasedimages.ImageFileError, OSError, EOFError, ValueError) as exc:
        raise ImageReadError(f"{path}: not a readable NIfTI volume ({exc})") from exc
    if data.ndim == 2:
        data = data[..., None]
    if data.ndim == 5 and data.shape[3] == 1:  # (X, Y, Z, 1, C): NIfTI vector images
        data = data[:, :, :, 0]
    if data.ndim not in (3, 4):
        raise ImageReadError(f"{path}: NIfTI of shape {data.shape}; expected 3D or 3D + channels")
    if data.ndim == 3:
        data = data[..., None]
    # (R, A, S, C) -> (S, P, L, C): slices inferior->superior, rows anterior->posterior, columns R->L
    vol = np.ascontiguousarray(data.transpose(2, 1, 0, 3)[:, ::-1, ::-1])
    spacing = (float(zooms[2]), float(zooms[1]), float(zooms[0])) if len(zooms) == 3 else None
    return ImageData(vol, path, spacing, None)


# --- NumPy ----------------------------------------------------------------------------------------


def _read_npy(path: Path, spatial_dims: int) -> ImageData:
    """`.npy` in our layout, (H, W[, C]) or (D, H, W[, C]); never unpickled."""
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ImageReadError(f"{path}: not a readable .npy array without pickles ({exc})") from exc
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ImageReadError(f"{path}: array of dtype {arr.dtype}; expected real numbers")
    if spatial_dims == 2 and arr.ndim == 3 and arr.shape[-1] > 4:
        raise ImageReadError(
            f"{path}: array of shape {arr.shape} has {arr.shape[-1]} channels; it looks like a volume "
            "(D, H, W): give it to a 3D task (spatial_dims 3), or save a 2D image as (H, W) or (H, W, C<=4)"
        )
    if arr.ndim == spatial_dims:
        arr = arr[..., None]
    elif arr.ndim != spatial_dims + 1:
        raise ImageReadError(
            f"{path}: array of shape {arr.shape}; a {spatial_dims}D task takes "
            f"{'(H, W) or (H, W, C)' if spatial_dims == 2 else '(D, H, W) or (D, H, W, C)'}"
        )
    value_range = (0.0, 1.0) if arr.dtype == np.uint8 else None
    pixels = arr.astype(np.float32) / 255.0 if arr.dtype == np.uint8 else arr.astype(np.float32)
    return ImageData(pixels, path, None, value_range)


_END_MARKERS = {".jpg": b"\xff\xd9", ".jpeg": b"\xff\xd9", ".png": b"IEND"}
_TAIL_BYTES = 1 << 16  # markers may be followed by padding or vendor data; look this far back


def _check_end_marker(path: Path, suffix: str) -> None:
    """A JPEG or PNG cut short (interrupted copy or download) has no end marker: catch it unopened."""
    marker = _END_MARKERS.get(suffix)
    if marker is None:
        return
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - _TAIL_BYTES))
        if marker not in fh.read():
            raise ImageReadError(
                f"{path}: truncated {suffix[1:].upper()} (no end-of-image marker); replace it"
            )


def probe_image(path: str | Path) -> None:
    """Cheap check that `path` is the kind of file it claims to be (header, and the end marker of a
    JPEG/PNG), without decoding pixels; raises ImageReadError. Damage inside the pixel data shows only
    when the image is read."""
    path = Path(path)
    if path.is_dir():  # a DICOM series: check one slice
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise ImageReadError(f"{path} is an empty folder")
        path = files[0]
    if not path.is_file():
        raise ImageReadError(f"image {path} does not exist")
    suffix = image_suffix(path)
    try:
        if suffix in PHOTO_SUFFIXES:
            from PIL import Image

            with Image.open(path) as img:
                _ = img.size
            _check_end_marker(path, suffix)
        elif suffix in DICOM_SUFFIXES or (suffix == "" and _has_dicom_preamble(path)):
            pydicom = _import_pydicom()
            pydicom.dcmread(path, stop_before_pixels=True)
        elif suffix in NIFTI_SUFFIXES:
            try:
                import nibabel as nib
            except ImportError as exc:
                raise MissingReaderError(f"reading NIfTI needs nibabel; {_INSTALL_HINT}") from exc
            nib.load(path)
        elif suffix in NPY_SUFFIXES:
            np.load(path, mmap_mode="r", allow_pickle=False)
    except WsiError:
        raise
    except Exception as exc:  # every library has its own error types; all mean "not this file"
        raise ImageReadError(f"{path}: not a readable image ({type(exc).__name__}: {exc})") from exc

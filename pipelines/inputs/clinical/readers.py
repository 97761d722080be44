"""Reading radiology, dermoscopy and fundus images: PNG/JPEG/TIFF, DICOM, NIfTI and NumPy `.npy`.

`read_image` picks the reader by suffix (the table lives in `formats`) and returns an `ImageData` in one
layout so the transforms never care where pixels came from: 2D images (H, W, C), volumes (D, H, W, C),
float32, channel last. Row 0 is the top of the picture (EXIF rotation applied); volumes are put in the
radiological display order (slices inferior to superior, rows anterior to posterior, columns patient
right to left, as DICOM axial images); a folder of single-frame DICOM slices is read as one volume
(`dicom`). `probe_image` checks a file cheaply without decoding its pixels.

pydicom and nibabel are optional (`pip install 'wsi[images]'`); a missing one raises
`MissingReaderError`, which a dataset does not mistake for one bad file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from wsi.core.errors import ImageReadError, WsiError
from wsi.core.suffixes import DICOM_SUFFIXES, IMAGE_SUFFIXES, NIFTI_SUFFIXES, NPY_SUFFIXES, PHOTO_SUFFIXES
from wsi.pipelines.inputs.clinical.dicom import probe_dicom, read_dicom, read_dicom_series
from wsi.pipelines.inputs.clinical.formats import (
    INSTALL_HINT,
    ImageData,
    MissingReaderError,
    image_suffix,
    is_dicom,
)


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
        data = read_dicom_series(path)
    elif suffix in PHOTO_SUFFIXES:
        data = _read_photo(path)
    elif is_dicom(path):
        data = read_dicom(path)
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


# --- photos ---------------------------------------------------------------------------------------


def _read_photo(path: Path) -> ImageData:
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            img = ImageOps.exif_transpose(opened)  # camera rotation tag -> rows top to bottom
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


# --- NIfTI ----------------------------------------------------------------------------------------


def _import_nibabel() -> Any:
    """The nibabel module (untyped), or MissingReaderError with the install hint."""
    try:
        import nibabel
    except ImportError as exc:
        raise MissingReaderError(f"reading NIfTI needs nibabel; {INSTALL_HINT}") from exc
    return nibabel


def _read_nifti(path: Path) -> ImageData:
    nib = _import_nibabel()
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
        elif is_dicom(path):
            probe_dicom(path)
        elif suffix in NIFTI_SUFFIXES:
            _import_nibabel().load(path)
        elif suffix in NPY_SUFFIXES:
            np.load(path, mmap_mode="r", allow_pickle=False)
    except WsiError:
        raise
    except Exception as exc:  # every library has its own error types; all mean "not this file"
        raise ImageReadError(f"{path}: not a readable image ({type(exc).__name__}: {exc})") from exc


__all__ = [  # the suffix table and ImageData are owned by `formats`; named here for readers' callers
    "DICOM_SUFFIXES",
    "IMAGE_SUFFIXES",
    "NIFTI_SUFFIXES",
    "NPY_SUFFIXES",
    "PHOTO_SUFFIXES",
    "ImageData",
    "MissingReaderError",
    "image_suffix",
    "probe_image",
    "read_image",
]

"""The one table of file suffixes: which file names are slides, clinical images, tile files and bags.

Folder search (`wsi.slides.sources`), the clinical image readers (`wsi.pipelines.inputs.clinical`), the label
matcher (which strips a suffix a label CSV may carry) and the `wsi tile` help all read this table, so a format
added here is found everywhere; three lists that had drifted apart (`.svslide`, `.czi`) are now one.
Suffixes are lower case; compare them with `Path.suffix.lower()` (or `name_suffix` for two-dot ones).

Whole-slide images (`SLIDE_SUFFIXES`), the formats openslide 4 reads (tiffslide reads the TIFF ones):
  .svs              Aperio SVS: JPEG or JPEG 2000 tiles in a TIFF, the most common scanner output
  .tif              Aperio, Trestle, Ventana, Huron and generic tiled pyramidal TIFF
  .tiff             Philips TIFF and generic tiled pyramidal TIFF
  .ndpi             Hamamatsu NDPI (TIFF-like, 64-bit offsets)
  .vms, .vmu        Hamamatsu VMS (index + JPEG files beside it) and VMU (uncompressed)
  .scn              Leica SCN
  .mrxs             MIRAX: an index file with a folder of data files beside it (give the .mrxs)
  .svslide          Sakura SVSlide (an SQLite file)
  .bif              Ventana BIF
  .czi              Zeiss CZI (openslide 4 and later; tiffslide cannot read it)
  .dcm              DICOM WSI: one slide is a series of .dcm files, one per level, so folder search
                    groups them by series (`wsi.slides.dicom_series`: one slide per series, id from its
                    folder) instead of taking each file (`FOLDER_SLIDE_SUFFIXES` leaves them out)
Plain images read as one-level slides (`IMAGE_SLIDE_SUFFIXES`, by `wsi.slides.plain_images`): .png .jpg .jpeg,
and a .tif/.tiff that no scanner format claims (strips, not tiles). They are slides only where a slide
is named (`NAMED_SLIDE_SUFFIXES`): a PATH or a slide list's row given to `wsi tile`, `wsi embed` or
`wsi predict`.
Folder search never takes them (`FOLDER_SLIDE_SUFFIXES`), so QC pictures and thumbnails lying beside
slides are not tiled, and a folder of dermoscopy or fundus JPEGs given to an image task stays images.
Clinical images (`IMAGE_SUFFIXES`), read by `wsi.pipelines.inputs.clinical`:
  .png .jpg .jpeg .tif .tiff .bmp    photographs (dermoscopy, fundus) and plain TIFFs
  .dcm .dicom                         DICOM images and series (radiology)
  .nii .nii.gz                        NIfTI volumes
  .npy                                NumPy arrays in our layout (never unpickled)
Our own files (`TILE_FILE_SUFFIX`, `TILE_PIXELS_SUFFIX`, `BAG_SUFFIX`): tiles/<id>.h5 (HDF5 coordinates),
tiles/<id>.zarr (zarr tile pixels), features/<encoder>/<id>.h5 (HDF5 bags, also STAMP/CLAM/TRIDENT's).
Named only (`NAMED_ONLY_SUFFIXES`): .ome.tif/.ome.tiff, OME-TIFF, which a label CSV may name although
no reader here opens it; the label matcher strips it so the id still matches.
"""

from __future__ import annotations

from pathlib import Path

#: whole-slide image formats (see the module docstring for why each is here)
SLIDE_SUFFIXES: tuple[str, ...] = (
    ".svs", ".tif", ".tiff", ".ndpi", ".vms", ".vmu", ".scn", ".mrxs", ".svslide", ".bif", ".czi", ".dcm",
)  # fmt: skip
#: DICOM WSI instances: found in folders as series (`wsi.slides.dicom_series`), not file by file
DICOM_SLIDE_SUFFIX = ".dcm"
#: slide formats found file by file when a folder is searched: DICOM is left out (many files per slide)
FOLDER_SLIDE_SUFFIXES: tuple[str, ...] = tuple(s for s in SLIDE_SUFFIXES if s != ".dcm")
#: plain images that open as one-level slides when named (never found by folder search)
IMAGE_SLIDE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg")
#: every suffix a slide given by name may carry: the whole-slide formats and the plain images
NAMED_SLIDE_SUFFIXES: tuple[str, ...] = SLIDE_SUFFIXES + IMAGE_SLIDE_SUFFIXES

PHOTO_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
DICOM_SUFFIXES: tuple[str, ...] = (".dcm", ".dicom")
NIFTI_SUFFIXES: tuple[str, ...] = (".nii", ".nii.gz")
NPY_SUFFIXES: tuple[str, ...] = (".npy",)
#: clinical images and volumes (2D and 3D tasks)
IMAGE_SUFFIXES: tuple[str, ...] = PHOTO_SUFFIXES + DICOM_SUFFIXES + NIFTI_SUFFIXES + NPY_SUFFIXES

TILE_FILE_SUFFIX = ".h5"  # tiles/<slide_id>.h5: coordinates and tiling provenance
TILE_PIXELS_SUFFIX = ".zarr"  # tiles/<slide_id>.zarr: the --save-tiles pixel cache
BAG_SUFFIX = ".h5"  # features/<encoder_id>/<slide_id>.h5: feature bags (ours and other tools')

#: formats no reader here opens, but which a label CSV may name
NAMED_ONLY_SUFFIXES: tuple[str, ...] = (".ome.tiff", ".ome.tif")
#: every suffix a file named in a label CSV may carry, longest first (".nii.gz" before ".gz" matters)
NAME_SUFFIXES: tuple[str, ...] = tuple(
    sorted(
        dict.fromkeys(
            NAMED_ONLY_SUFFIXES + SLIDE_SUFFIXES + IMAGE_SUFFIXES + (BAG_SUFFIX, TILE_PIXELS_SUFFIX)
        ),
        key=len,
        reverse=True,
    )
)


def name_suffix(path: str | Path) -> str:
    """The suffix of `path` as this table spells it: lower case, two-dot ones (".nii.gz") whole."""
    name = Path(path).name.lower()
    for suffix in NAME_SUFFIXES:
        if "." in suffix[1:] and name.endswith(suffix):
            return suffix
    return Path(name).suffix


def strip_suffix(name: str) -> str:
    """`name` without a known suffix (any case), e.g. "TCGA-01.svs" -> "TCGA-01"; else unchanged."""
    lower = name.lower()
    for suffix in NAME_SUFFIXES:
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return name

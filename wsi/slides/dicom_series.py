"""DICOM whole-slide series in folders: one slide per series, not one per file.

A DICOM WSI is a series of instances, usually one `.dcm` per pyramid level plus label, overview and
thumbnail images, all sharing a SeriesInstanceUID (DICOM PS3.3 A.32.8, VL Whole Slide Microscopy Image
IOD), as scanners and `wsi2dcm` / wsidicomizer write them. openslide 4 opens a series from any one of its
VOLUME instances and finds the others in the same folder, so the slide's path is the series' level-0
instance (the largest TotalPixelMatrixColumns) and the id is the folder's name; a folder that holds several
series gets one slide per series, named `<folder>-<last 8 digits of the series UID>`.

Only headers are read here (pydicom, stop_before_pixels); a `.dcm` that is not a whole-slide image
(radiology, a damaged file) is left out of the search with one log line each.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: SOP Class UID of VL Whole Slide Microscopy Image Storage
WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"


@dataclass(frozen=True)
class DicomSeries:
    """One whole-slide series found in a folder."""

    name: str  # the slide id's source: the folder name (+ series suffix when the folder holds several)
    path: Path  # the level-0 VOLUME instance (openslide finds the others beside it)
    series_uid: str
    n_files: int


def _header(path: Path) -> tuple[str, str, int] | None:
    """(series UID, image type's third value, columns) of a WSI instance; None for anything else."""
    try:
        import pydicom
        from pydicom.errors import InvalidDicomError
    except ImportError:  # pydicom is the `images` extra; openslide (a dependency) reads the same tags
        return _header_openslide(path)

    try:
        ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=[
            "SOPClassUID", "SeriesInstanceUID", "ImageType", "TotalPixelMatrixColumns",
        ])  # fmt: skip
    except (InvalidDicomError, OSError, ValueError, EOFError) as exc:
        log.info("%s: not read as DICOM (%s); left out", path, exc)
        return None
    if str(ds.get("SOPClassUID", "")) != WSI_SOP_CLASS:
        log.info("%s: a DICOM file but not a whole-slide image; left out", path)
        return None
    image_type = list(ds.get("ImageType", []) or [])
    flavour = str(image_type[2]).upper() if len(image_type) > 2 else "VOLUME"
    return str(ds.get("SeriesInstanceUID", "")), flavour, int(ds.get("TotalPixelMatrixColumns", 0) or 0)


def _header_openslide(path: Path) -> tuple[str, str, int] | None:
    """`_header` without pydicom: openslide opens the instance's whole series and names its tags
    (`dicom.SeriesInstanceUID`, ...); slower, as it reads the series' other files too."""
    import openslide

    try:
        with openslide.OpenSlide(path) as slide:
            props = dict(slide.properties)
            width = int(slide.dimensions[0])
    except (openslide.OpenSlideError, OSError) as exc:
        log.info("%s: not a DICOM whole-slide image openslide reads (%s); left out", path, exc)
        return None
    if props.get("dicom.SOPClassUID") != WSI_SOP_CLASS:
        return None
    return props.get("dicom.SeriesInstanceUID", ""), str(props.get("dicom.ImageType[2]", "VOLUME")), width


def find_series(files: list[Path]) -> list[DicomSeries]:
    """Whole-slide series among `.dcm` files, grouped by folder and SeriesInstanceUID, in path order."""
    groups: dict[tuple[Path, str], list[tuple[Path, str, int]]] = defaultdict(list)
    for path in sorted(files):
        head = _header(path)
        if head is not None:
            uid, flavour, columns = head
            groups[(path.parent, uid)].append((path, flavour, columns))
    per_folder: dict[Path, int] = defaultdict(int)
    for folder, _ in groups:
        per_folder[folder] += 1
    series = []
    for (folder, uid), members in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        volumes = [m for m in members if m[1] == "VOLUME"] or members
        level0 = max(volumes, key=lambda m: (m[2], str(m[0])))[0]
        name = folder.name if per_folder[folder] == 1 else f"{folder.name}-{uid.replace('.', '')[-8:]}"
        series.append(DicomSeries(name, level0, uid, len(members)))
    return series


__all__ = ["WSI_SOP_CLASS", "DicomSeries", "find_series"]

"""Slides in a remote folder: what `wsi.slides.sources.find_slides` does for a local folder, from one listing.

Slide files are found by suffix (`wsi.core.suffixes.FOLDER_SLIDE_SUFFIXES`) in the folder and below it; names
starting with '.' (and temporary uploads) are left out. DICOM instances (.dcm) are one slide per folder
(the series a scanner exports into it), named after the folder: reading every instance's header to group
them by SeriesInstanceUID, as the local search does, would download them all before any work.
"""

from __future__ import annotations

import posixpath

from wsi.core.files import slide_name_from_path
from wsi.core.suffixes import DICOM_SLIDE_SUFFIX, FOLDER_SLIDE_SUFFIXES
from wsi.storage.fs import list_files
from wsi.storage.urls import Url, join


def remote_slides(folder: Url) -> list[tuple[str, Url]]:
    """(name the slide id is made from, URL) of every slide under `folder`, sorted by URL. A missing
    bucket or refused credentials raise StorageError (nothing can run); a missing folder gives []."""
    files = list_files(folder, suffixes=(*FOLDER_SLIDE_SUFFIXES, DICOM_SLIDE_SUFFIX), doing="listing slides")
    found: list[tuple[str, Url]] = []
    series: dict[str, str] = {}
    for rel in sorted(files):
        if rel.lower().endswith(DICOM_SLIDE_SUFFIX):
            series.setdefault(posixpath.dirname(rel), rel)  # the first instance stands for its series
            continue
        found.append((slide_name_from_path(posixpath.basename(rel)), join(folder, rel)))
    for parent, rel in series.items():
        name = posixpath.basename(parent) or posixpath.basename(str(folder).rstrip("/"))
        found.append((name, join(folder, rel)))
    return sorted(found, key=lambda item: str(item[1]))


__all__ = ["remote_slides"]

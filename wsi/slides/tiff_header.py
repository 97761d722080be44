"""What a slide file's TIFF header says before any library opens it: whether it is a TIFF at all (which
picks the direct JPEG reader and the device decoder's path), and its level-0 resolution tags (the mpp
of a generic TIFF whose vendor metadata has none)."""

from __future__ import annotations

from pathlib import Path

from wsi.storage.slides import RangeFile, open_binary

#: resolution tags outside this range (um/px) are defaults such as 72 dpi, not a scan resolution
PLAUSIBLE_MPP = (0.01, 50.0)
_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


def is_tiff(path: Path | RangeFile) -> bool:
    """Whether the file starts like a TIFF (classic or BigTIFF, either byte order)."""
    with open_binary(path) as fh:
        return fh.read(4) in _TIFF_MAGIC


def mpp_from_tiff_tags(path: Path | RangeFile) -> float | None:
    """um/px from level-0 XResolution/YResolution + ResolutionUnit (centimetre or inch only), when it is
    within PLAUSIBLE_MPP."""
    mpp = tiff_resolution_um(path)
    lo, hi = PLAUSIBLE_MPP
    return mpp if mpp is not None and lo <= mpp <= hi else None


def tiff_resolution_um(path: Path | RangeFile) -> float | None:
    """um/px that level 0's XResolution + ResolutionUnit (centimetre or inch) say, plausible or not."""
    if not is_tiff(path):
        return None
    import tifffile

    try:
        with open_binary(path) as fh, tifffile.TiffFile(fh) as tif:
            tags = tif.pages.first.tags
            unit = tags.get("ResolutionUnit")
            xres = tags.get("XResolution")
            if unit is None or xres is None:
                return None
            unit_um = {2: 25400.0, 3: 10000.0}.get(int(unit.value))
            num, den = xres.value if isinstance(xres.value, tuple) else (xres.value, 1)
    except Exception:
        return None
    if unit_um is None or not num or not den:
        return None
    return float(unit_um * den / num)


__all__ = ["PLAUSIBLE_MPP", "is_tiff", "mpp_from_tiff_tags", "tiff_resolution_um"]

"""A slide file with some of its stored JPEG tiles broken, for the tests of what one bad tile costs."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path


def damage_tiles(source: Path, path: Path, cells: Sequence[tuple[int, int]]) -> Path:
    """`path`: a copy of `source` with the first 400 bytes of each (col, row) stored tile of its first
    page zeroed (found through the TIFF's TileOffsets): not a JPEG any more, for every decoder."""
    import tifffile

    shutil.copy(source, path)
    path.chmod(0o644)
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        per_row = -(-page.imagewidth // page.tilewidth)
        offsets = [page.tags["TileOffsets"].value[row * per_row + col] for col, row in cells]
    with open(path, "r+b") as fh:
        for offset in offsets:
            fh.seek(offset)
            fh.write(bytes(400))
    return path


__all__ = ["damage_tiles"]

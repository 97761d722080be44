"""The shape of a marker stroke: a band of even width, far longer than it is wide, and of one even colour.

A marker is drawn: each stroke is the pen's tip dragged across the glass, so its region is a band as
wide as the tip (0.3-2 mm) and many times as long, its inside as smooth as the ink. What shares a
marker's colour without its shape is tissue or blood: a pool of haemorrhage or a clot is a blob, a
congested vessel a thin and uneven tube, DAB-stained tissue in IHC a patchwork of cells. The measures,
per connected region of a mask at `mpp` um/px (each on its bounding box, so the cost follows the regions,
not the thumbnail):

- width: twice the largest inscribed radius (the distance transform's maximum), in um;
- elongation: area / width^2, the band's length over its width (a disk is pi/4, a stroke loop 10-40).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

#: gaps inside a stroke (streaks of a drying marker) up to this wide (um) are closed
STREAK_GAP_UM = 60.0


@dataclass(frozen=True)
class Band:
    """What makes a region a stroke: at least `min_width_um` wide and `min_elongation` times longer."""

    min_width_um: float
    min_elongation: float


#: a stroke of brown marker: at least 300 um wide (a marker's tip is 300-2,000 um; Ink-WSI's brown loops
#: 600-1,100 um) and 3 times as long; DAB-stained tissue and pigment are patches, specks and thinner
#: bands (a 170 um band of DAB on HistoQC's IHC coverslip slide)
BROWN_BAND = Band(min_width_um=300.0, min_elongation=3.0)
#: a band of yellow tissue-marking dye along a margin: thinner (painted on the specimen's surface, cut
#: across), at least 150 um wide and 3 times as long
DYE_BAND = Band(min_width_um=150.0, min_elongation=3.0)
#: a stroke of translucent grey or purple-black marker, whose colour dense nuclei share: at least 250 um
#: wide and 5 times as long (a marker line across a section; a biopsy core is paler than such marker)
GREY_BAND = Band(min_width_um=250.0, min_elongation=5.0)
#: ... and of grey marker over tissue found by the grey it adds (`grey_marker.grey_excess`), which no tissue
#: adds: a finer line counts, at least 150 um wide (MSKCC's fine lines over tissue: 150-250 um, broken
#: into pieces 5-6 times as long as wide; 100 um took a few dark tissue edges on the tuning images)
GREY_EXCESS_BAND = Band(min_width_um=150.0, min_elongation=5.0)
#: a red stroke that absorbs as much red light as haemorrhage can: at least 80 um wide and 2.5 times as
#: long (a pool of blood or a clot is a blob, 0.8-2; HistoQC's fine red strokes: 100-130 um, 2.5-3.6)
RED_BAND = Band(min_width_um=80.0, min_elongation=2.5)


def region_shapes(
    mask: np.ndarray, mpp: float, band: Band | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels (h, w) int32, width_um (n + 1,), elongation (n + 1,)) of the 8-connected regions of a bool
    `mask` at `mpp` um/px; index 0 (no region) is 0 in both. With a `band`, regions too small to be one
    (area under min_elongation x min_width^2) are not measured (0 in both): most regions are specks."""
    if not mask.any():  # nothing to measure (a colour no pixel has): no labelling pass
        return np.zeros(mask.shape, np.int32), np.zeros(1), np.zeros(1)
    labels, n = ndimage.label(mask, structure=np.ones((3, 3), bool))
    width = np.zeros(n + 1)
    elongation = np.zeros(n + 1)
    least = band.min_elongation * (band.min_width_um / mpp) ** 2 if band is not None else 0.0
    areas = np.bincount(labels.ravel(), minlength=n + 1)
    for i, box in enumerate(ndimage.find_objects(labels), 1):
        if box is None or areas[i] < least:
            continue
        part = np.pad(labels[box] == i, 1)
        radius = float(ndimage.distance_transform_edt(part).max())  # px, >= 1 for any pixel
        area = float(np.count_nonzero(part))
        width[i] = 2.0 * radius * mpp
        elongation[i] = area / (4.0 * radius * radius)
    return labels, width, elongation


def bands(mask: np.ndarray, mpp: float, band: Band) -> np.ndarray:
    """(h, w) bool: the regions of `mask` shaped like a stroke (`Band`)."""
    labels, width, elongation = region_shapes(mask, mpp, band)
    keep = (width >= band.min_width_um) & (elongation >= band.min_elongation)
    keep[0] = False
    return keep[labels]

"""The tissue mask on real slide thumbnails with heavy marker, pale tissue and faint stain: the share of
tissue cells (256 um grid cells mostly coloured, not white, not marker colour) that lie inside the
candidate tiles, against an independent colour rule (or, for WSIPenMarkingRemoval's skin, the same
sections scanned before they were marked). Images: benchmarks/images/SOURCES.tsv (MIT), the MSKCC
fixtures (tests/fixtures/artifacts) and ../shared/data/artifacts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from wsi.slides.thumbnail import Thumbnail
from wsi.tiling.grid import TissueGrid, cell_boxes, find_tissue
from wsi.tiling.params import TileParams, TissueParams
from wsi.tiling.tissue import cell_fractions, find_tissue_mask, left_out, marker_colours, saturation

REPO = Path(__file__).resolve().parents[3]
IMAGES = REPO / "benchmarks" / "images"
MSKCC = REPO / "tests" / "fixtures" / "artifacts" / "mskcc"


def _rgb(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def _found(rgb: np.ndarray, mpp: float, params: TileParams | None = None) -> TissueGrid:
    h, w = rgb.shape[:2]
    slide = SimpleNamespace(path=Path("in memory"), dimensions=(w, h), mpp=mpp, properties={})
    thumb = Thumbnail(rgb, np.zeros((h, w), bool), mpp)
    return find_tissue(slide, params or TileParams(), thumbnail=thumb)  # type: ignore[arg-type]


def tissue_cells_inside(
    rgb: np.ndarray, mpp: float, truth_rgb: np.ndarray | None = None
) -> tuple[float, int]:
    """(share of the tissue cells inside the candidate tiles, number of tissue cells)."""
    found = _found(rgb, mpp)
    ref = rgb if truth_rgb is None else truth_rgb
    coloured = (saturation(ref) > 0.1) & (ref.min(axis=-1) < 215) & ~marker_colours(ref)
    boxes = cell_boxes(found.grid, rgb.shape[:2], level0_width=rgb.shape[1], level0_height=rgb.shape[0])
    tissue = cell_fractions(coloured, boxes) >= 0.5
    inside = np.zeros(len(found.grid), bool)
    inside[found.candidates] = True
    return float((tissue & inside).sum() / max(1, tissue.sum())), int(tissue.sum())


def test_marker_does_not_set_the_tissue_split() -> None:
    """Strong blue and black marker made a third saturation mode that pulled Otsu's split over the
    pale tissue: 4%, 3% and 10% of these slides' tissue cells were candidates before."""
    cases = [
        (IMAGES / "tml_lavender_blue-marker.png", 40.0),  # blue loop over lavender sections
        (MSKCC / "thumbnail_00005.jpg", 24.0),  # vivid blue triangle over lung
        (MSKCC / "thumbnail_00293.jpg", 24.0),  # purple-black square over lung
    ]
    for path, mpp in cases:
        share, n = tissue_cells_inside(_rgb(path), mpp)
        assert n > 500, path.name
        assert share >= 0.98, (path.name, share)


def test_marked_skin_keeps_the_tissue_its_clean_scan_shows() -> None:
    """The truth from the sections scanned before the translucent blue loops were drawn."""
    marked = _rgb(IMAGES / "wpmr_skin_translucent-blue_marked.png")
    clean = _rgb(IMAGES / "wpmr_skin_clean.png")
    share, n = tissue_cells_inside(marked, 40.0, truth_rgb=clean)
    assert n > 800 and share >= 0.98, share


def test_pale_tissue_joined_to_dense_tissue_is_tissue(shared_data: Path) -> None:
    """Lacy lung, fibrin and loose stroma paler than the split that dense tumour or a clot sets: in
    the mask where they join the tissue over it (85-94% of these slides' tissue cells before)."""
    look = shared_data / "artifacts" / "lookalikes"
    cases = [
        (look / "ink01_mskcc_thumbnail_00160_clot_black-ink.jpg", 20.0),
        (look / "neg06_mskcc_thumbnail_00160_inkfree-crop_clot.png", 16.0),
        (IMAGES / "mskcc_thumbnail_00207.jpg", 24.0),
    ]
    for path, mpp in cases:
        share, _ = tissue_cells_inside(_rgb(path), mpp)
        assert share >= 0.98, (path.name, share)


def test_images_fine_before_stay_fine(shared_data: Path) -> None:
    """Glass stays glass: the pale split does not flood the slide (mask at most a few points larger)."""
    qc = shared_data / "artifacts" / "histoqc"
    for name, mpp in (("coverslip_edge_he__coverslip_edge", 16.0), ("pen__1k_version__pen_green", 16.0)):
        rgb = _rgb(qc / f"{name}.png")
        share, _ = tissue_cells_inside(rgb, mpp)
        mask = find_tissue_mask(rgb, mpp=mpp).mask
        assert share >= 0.98 and mask.mean() < 0.5, (name, share, mask.mean())
    rgb = _rgb(shared_data / "artifacts" / "histolab" / "no-tissue.png")
    assert find_tissue_mask(rgb, mpp=8.0).mask.mean() < 0.02  # a blank slide gains nothing


def test_left_out_is_counted_by_why() -> None:
    """A split set too high (here a user's floor of 0.3) leaves pale tissue out as glass, the marker's
    paler pixels as ink, and regions under min_region_um2 as debris; each counted in mm^2."""
    rgb = _rgb(IMAGES / "tml_lavender_blue-marker.png")
    params = TissueParams(min_saturation=0.3, min_region_um2=2e6)
    finding = find_tissue_mask(rgb, mpp=40.0, params=params)
    missed = left_out(rgb, finding, mpp=40.0, params=params)
    px_mm2 = (40.0 / 1000) ** 2
    assert missed.tissue_mm2 == pytest.approx(finding.mask.sum() * px_mm2)
    assert missed.glass_mm2 > missed.tissue_mm2  # most lavender tissue is under 0.3
    assert missed.ink_mm2 > 0.1 and missed.debris_mm2 > 0.0
    assert missed.share(missed.total_mm2) > 0.5
    assert "glass" in missed.describe() and "mm2 coloured" in missed.describe()
    usual = find_tissue_mask(rgb, mpp=40.0)
    assert left_out(rgb, usual, mpp=40.0, params=TissueParams()).glass_mm2 < 0.01 * missed.glass_mm2

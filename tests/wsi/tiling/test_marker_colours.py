"""Marker colours the tile's own pixels catch: translucent blue drawn over tissue (WSIPenMarkingRemoval's
tile pairs, the same 256 px tile before and after marking; benchmarks/images, MIT), while the same
tissue unmarked, H&E nuclei and IHC haematoxylin are not ink."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from skimage import data

from wsi.tiling.artifacts import ArtifactParams, tile_ink_share

IMAGES = Path(__file__).resolve().parents[3] / "benchmarks" / "images"
PARAMS = ArtifactParams()


def test_translucent_blue_over_tissue_is_ink_and_the_clean_tile_is_not() -> None:
    pairs = sorted(IMAGES.glob("wpmr_pair_*.jpg"))
    assert len(pairs) == 4
    for path in pairs:
        rgb = np.asarray(Image.open(path).convert("RGB"))
        clean, marked = tile_ink_share(np.stack([rgb[:, :256], rgb[:, 256:]]), PARAMS)
        # measured 0.83-0.99 marked (0.01-0.5 with blue's saturation floor of 0.4 alone), 0 clean
        assert marked > 5 * PARAMS.max_ink_fraction, (path.name, marked)
        assert clean <= 0.01, (path.name, clean)


def test_nuclei_and_ihc_haematoxylin_are_not_translucent_blue(shared_data: Path) -> None:
    tiles = [data.immunohistochemistry()[:256, :256], data.immunohistochemistry()[256:512, 256:512]]
    histolab = shared_data / "artifacts" / "histolab"
    for name in ("medium-nuclei-score-level0.png", "low-nuclei-score-level0.png",
                 "tissue-level0-7352-11762-7864-12274.png"):  # fmt: skip
        rgb = np.asarray(Image.open(histolab / name).convert("RGB"))
        tiles.append(np.asarray(Image.fromarray(rgb).resize((256, 256))))
    share = tile_ink_share(np.stack(tiles), PARAMS)
    assert (share <= PARAMS.max_ink_fraction / 2).all(), share

"""Stain normalisation: known answers (Reinhard statistics, Macenko's stain matrix) and no NaN, ever."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from skimage.color import rgb2lab

from wsi.core.errors import ConfigError
from wsi.models.encoders.stain import (
    DEFAULT_MACENKO,
    DEFAULT_REINHARD,
    StainNormalizer,
    StainReference,
    fit_reference,
    load_reference,
    macenko_stains,
    save_reference,
)

# Unit H and E optical-density vectors of a real H&E stain (Macenko's reference): the synthetic tiles' stains.
# (Ruifrok's eosin absorbs almost no red: Macenko's all-channels-above-beta rule would hide pure eosin.)
H = torch.tensor([0.5626, 0.7201, 0.4062])
E = torch.tensor([0.2159, 0.8012, 0.5581])
H, E = H / H.norm(), E / E.norm()


def _he_tiles(n: int = 3, side: int = 64, seed: int = 0, stains: tuple = (H, E)) -> torch.Tensor:
    """Tiles made from known stains: OD = c_H * H + c_E * E, with pure-H and pure-E pixels among them."""
    g = torch.Generator().manual_seed(seed)
    conc = torch.rand(n, side * side, 2, generator=g) + 0.75  # U(0.75, 1.75): pure stains stay above beta
    kind = torch.randint(0, 4, (n, side * side), generator=g)
    conc[..., 1] = torch.where(kind == 0, 0.0, conc[..., 1])  # a quarter pure haematoxylin
    conc[..., 0] = torch.where(kind == 1, 0.0, conc[..., 0])  # a quarter pure eosin
    od = conc @ torch.stack(stains, dim=1).T  # (n, N, 3)
    rgb = 240.0 * torch.exp(-od) - 1.0
    return rgb.clamp(0, 255).round().to(torch.uint8).reshape(n, side, side, 3)


def test_macenko_recovers_the_stain_matrix_it_was_made_from() -> None:
    stains, max_conc, ok = macenko_stains(_he_tiles())
    assert ok.all()
    cos_h = torch.nn.functional.cosine_similarity(stains[..., 0], H.expand(3, 3), dim=-1)
    cos_e = torch.nn.functional.cosine_similarity(stains[..., 1], E.expand(3, 3), dim=-1)
    assert cos_h.min() > 0.999 and cos_e.min() > 0.999, (cos_h, cos_e)  # H first: it absorbs more red
    assert ((max_conc - 1.74).abs() < 0.1).all()  # 99th percentile of U(0.75, 1.75)


def test_macenko_maps_tiles_onto_the_reference_stains() -> None:
    other = (torch.tensor([0.55, 0.75, 0.37]), torch.tensor([0.15, 0.92, 0.36]))
    other = (other[0] / other[0].norm(), other[1] / other[1].norm())
    tiles = _he_tiles(2, stains=other, seed=1)
    reference = fit_reference("macenko", _he_tiles(4, seed=2))
    out = StainNormalizer(reference)(tiles)
    stains, _, ok = macenko_stains(out)  # the normalised tiles now show the reference's stains
    ref = torch.tensor(reference.stain_matrix)
    assert ok.all()
    assert torch.nn.functional.cosine_similarity(stains, ref.expand(2, 3, 2), dim=1).min() > 0.995


def test_reinhard_maps_lab_mean_and_std_onto_the_reference_exactly() -> None:
    g = torch.Generator().manual_seed(0)
    base = torch.tensor([180.0, 120.0, 170.0])  # an H&E-like pink-purple: every pixel is tissue
    tiles = (base + torch.randn(2, 48, 48, 3, generator=g) * torch.tensor([8.0, 10.0, 7.0])).round()
    tiles = tiles.clamp(0, 255).to(torch.uint8)
    reference = StainReference(method="reinhard", lab_mean=(60.0, 25.0, -10.0), lab_std=(6.0, 4.0, 3.0))
    norm = StainNormalizer(reference)
    out = norm.normalize(tiles)  # float RGB, before rounding to uint8
    assert float(out.min()) > 0 and float(out.max()) < 255  # nothing clipped: the answer is exact
    for tile in out.numpy():
        lab = rgb2lab(tile / 255.0).reshape(-1, 3)  # scikit-image, independent of our conversion
        np.testing.assert_allclose(lab.mean(0), reference.lab_mean, atol=1e-3)
        np.testing.assert_allclose(lab.std(0), reference.lab_std, atol=1e-3)
    assert (norm.n_tiles, norm.n_fallback) == (2, 0)


@pytest.mark.parametrize("reference", [DEFAULT_MACENKO, DEFAULT_REINHARD], ids=["macenko", "reinhard"])
def test_background_and_pen_tiles_fall_back_and_are_counted(reference: StainReference) -> None:
    glass = torch.full((1, 64, 64, 3), 243, dtype=torch.uint8)
    pen = torch.zeros(1, 64, 64, 3, dtype=torch.uint8)
    pen[..., 0], pen[..., 1], pen[..., 2] = 30, 60, 160  # a blue marker: one colour, no second stain
    tissue = _he_tiles(1)
    tiles = torch.cat([glass, pen, tissue, glass])
    norm = StainNormalizer(reference)
    out = norm(tiles)
    assert out.dtype == torch.uint8 and out.shape == tiles.shape
    assert torch.equal(out[0], glass[0]) and torch.equal(out[3], glass[0])
    assert not torch.equal(out[2], tissue[0])  # the tissue tile was normalised
    if reference.method == "macenko":
        assert torch.equal(out[1], pen[0])
        assert (norm.n_tiles, norm.n_fallback) == (4, 3)
    else:  # Reinhard only needs spread in LAB; a flat pen tile has none
        assert torch.equal(out[1], pen[0]) and norm.n_fallback == 3
    assert norm.provenance()["stain_fallback_tiles"] == norm.n_fallback
    assert torch.isfinite(norm.normalize(torch.zeros(2, 8, 8, 3, dtype=torch.uint8))).all()


def test_reference_fit_save_and_load(tmp_path: Path, shared_data: Path) -> None:
    from wsi.slides.slide import open_slide

    slide = open_slide(shared_data / "slides" / "CMU-1-Small-Region.svs")
    step = int(256 / slide.mpp)
    w, h = slide.dimensions
    tiles = torch.from_numpy(
        np.stack(
            [
                slide.read_region_um(x, y, 256.0, 1.0)
                for y in range(0, h - step, step)
                for x in range(0, w - step, step)
            ]
        )
    )
    reinhard = fit_reference("reinhard", tiles, source="CMU-1-Small-Region")
    # the shipped default is this fit, rounded
    np.testing.assert_allclose(reinhard.lab_mean, DEFAULT_REINHARD.lab_mean, atol=0.01)
    np.testing.assert_allclose(reinhard.lab_std, DEFAULT_REINHARD.lab_std, atol=0.01)
    macenko = fit_reference("macenko", tiles)
    real_h = torch.tensor(macenko.stain_matrix)[:, 0]
    ruifrok_h = torch.tensor([0.650, 0.704, 0.286])
    assert torch.dot(real_h / real_h.norm(), ruifrok_h / ruifrok_h.norm()) > 0.9  # where the textbook says
    save_reference(macenko, tmp_path / "ref.json")
    assert load_reference(tmp_path / "ref.json") == macenko
    (tmp_path / "bad.json").write_text('{"method": "macenko", "stain_matrix": [[1, 0], [0, 1], [0, 0]]}')
    with pytest.raises(ConfigError, match="max_concentrations"):
        load_reference(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="tissue pixels"):
        fit_reference("reinhard", torch.full((2, 16, 16, 3), 250, dtype=torch.uint8))

"""What a bag records about how its tiles became features, and the re-run decisions made from it (issue 12
items 5, 6): the encoder's recipe and its digest (an edited YAML encoder of the same name is redone, an
edited licence note is not), the mpp warning, and opt-in stain normalisation (method, reference digest,
fallback count; bags differ with and without it; background-only tiles give no NaN, only fallbacks)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from wsi.core.config import parse_config
from wsi.core.errors import ConfigError
from wsi.formats.bags import read_bag
from wsi.formats.tile_file import read_tile_file, write_tile_file
from wsi.models.encoders.stain import DEFAULT_MACENKO, StainReference, save_reference
from wsi.pipelines.embed import EmbedOptions, embed_tiles
from wsi.pipelines.tile.stage import tile_slides
from wsi.slides.slide import open_slide
from wsi.slides.sources import find_slides
from wsi.tiling.params import TileParams

OPTIONS = EmbedOptions(
    encoder="timm:test_resnet", random_init=True, input_px=64, batch_size=8, readers=0, dtype="float32",
    threads=1,
)  # fmt: skip
BAGS = "features/timm-test_resnet"
TILE_UM, TILE_PX = 128.0, 32


@pytest.fixture(scope="module")
def run_dir(make_slide, tmp_path_factory: pytest.TempPathFactory) -> Path:
    slide = make_slide(name="prov-a", size_um=800.0, mpp=1.0, seed=6)
    out = tmp_path_factory.mktemp("prov-run")
    params = TileParams(tile_um=TILE_UM, tile_px=TILE_PX, min_blur_variance=0)
    assert [r.status for r in tile_slides(find_slides([slide.path]), out_dir=out, params=params)] == ["ok"]
    return out


def _run(run: Path, out: Path, options: EmbedOptions) -> list[str]:
    return [r.status for r in embed_tiles(tiles_dir=run, out_dir=out, options=options, progress=False)]


def _recipe(path: Path, **changes: object) -> str:
    recipe = {"arch": "test_resnet", "dim": 96, "input_px": 64, "training_mpp": 0.5, "licence": "test",
              "channels_last": True, **changes}  # fmt: skip
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def test_an_edited_yaml_encoder_is_redone_and_the_recipe_is_recorded(
    run_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    yaml_path = tmp_path / "my-enc.yaml"
    options = dataclasses.replace(OPTIONS, encoder=_recipe(yaml_path), input_px=None)
    with caplog.at_level(logging.WARNING):
        assert _run(run_dir, tmp_path, options) == ["ok"]
    # tiles at 4 um/px, the recipe trained at 0.5: 8x away, said once
    assert caplog.text.count("trained on tiles at 0.5 um/px but these tiles are at 4 um/px") == 1
    bag_path = tmp_path / "features" / "my-enc" / "prov-a.h5"
    first = read_bag(bag_path)
    prov = first.provenance
    assert prov is not None and prov.encoder_recipe is not None and prov.recipe_sha256
    assert prov.encoder_recipe["arch"] == "test_resnet" and prov.encoder_recipe["mean"] == [
        0.485,
        0.456,
        0.406,
    ]
    assert prov.stain_norm is None and prov.stain_fallback_tiles is None
    # a note that changes no feature: still current
    _recipe(yaml_path, licence="CC-BY-4.0")
    assert _run(run_dir, tmp_path, options) == ["skipped"]
    # same name, another normalisation: the bag is stale and redone
    _recipe(yaml_path, mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])
    with caplog.at_level(logging.WARNING):
        assert _run(run_dir, tmp_path, options) == ["ok"]
    assert "recipe changed" in caplog.text
    again = read_bag(bag_path)
    assert again.provenance is not None and again.provenance.recipe_sha256 != prov.recipe_sha256
    assert not np.allclose(again.feats, first.feats)


def test_stain_normalisation_changes_the_bags_and_is_recorded(run_dir: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    assert _run(run_dir, plain, OPTIONS) == ["ok"]
    macenko = dataclasses.replace(OPTIONS, stain_norm="macenko")
    assert _run(run_dir, tmp_path / "m", macenko) == ["ok"]
    a, b = read_bag(plain / BAGS / "prov-a.h5"), read_bag(tmp_path / "m" / BAGS / "prov-a.h5")
    assert a.feats.shape == b.feats.shape and np.isfinite(b.feats).all()
    assert np.abs(a.feats - b.feats).mean() > 1e-3  # the encoder saw other pixels
    prov = b.provenance
    assert prov is not None and prov.stain_norm == "macenko"
    assert prov.stain_reference_sha256 == DEFAULT_MACENKO.digest()
    assert prov.stain_reference is not None and prov.stain_reference["method"] == "macenko"
    assert prov.stain_fallback_tiles is not None and 0 <= prov.stain_fallback_tiles < len(b)
    # current with the same normalisation; another method, or none, redoes the bag
    assert _run(run_dir, tmp_path / "m", macenko) == ["skipped"]
    assert _run(run_dir, tmp_path / "m", dataclasses.replace(OPTIONS, stain_norm="reinhard")) == ["ok"]
    assert read_bag(tmp_path / "m" / BAGS / "prov-a.h5").meta["stain_norm"] == "reinhard"
    assert _run(run_dir, tmp_path / "m", OPTIONS) == ["ok"]
    assert "stain_norm" not in read_bag(tmp_path / "m" / BAGS / "prov-a.h5").meta
    np.testing.assert_array_equal(read_bag(tmp_path / "m" / BAGS / "prov-a.h5").feats, a.feats)


def test_a_stain_reference_fitted_from_an_image_or_saved(run_dir: Path, tmp_path: Path) -> None:
    tf = read_tile_file(run_dir / "tiles" / "prov-a.h5")
    with open_slide(tf.slide_path) as slide:  # a tissue image of this slide: the reference to fit
        tiles = [slide.read_region_um(int(x), int(y), TILE_UM, 1.0) for x, y in tf.coords[:4]]
    Image.fromarray(np.concatenate(tiles, axis=1)).save(tmp_path / "ref.png")
    fitted = dataclasses.replace(OPTIONS, stain_norm="reinhard", stain_reference=str(tmp_path / "ref.png"))
    assert _run(run_dir, tmp_path / "img", fitted) == ["ok"]
    prov = read_bag(tmp_path / "img" / BAGS / "prov-a.h5").provenance
    assert prov is not None and prov.stain_reference is not None
    assert "ref.png" in prov.stain_reference["source"] and prov.stain_reference_sha256
    # the same reference from its tile file, and saved as JSON: one digest, so the bag stays current
    from_tiles = dataclasses.replace(fitted, stain_reference=str(run_dir / "tiles" / "prov-a.h5"))
    assert _run(run_dir, tmp_path / "tf", from_tiles) == ["ok"]
    saved = tmp_path / "ref.json"
    save_reference(parse_config(StainReference, prov.stain_reference, source="bag"), saved)
    assert _run(run_dir, tmp_path / "img", dataclasses.replace(fitted, stain_reference=str(saved))) == [
        "skipped"
    ]
    with pytest.raises(ConfigError, match="is a reinhard reference, not macenko"):
        _run(run_dir, tmp_path, dataclasses.replace(fitted, stain_norm="macenko", stain_reference=str(saved)))
    with pytest.raises(ConfigError, match="needs --stain-norm"):
        EmbedOptions(stain_reference=str(saved))


@pytest.mark.parametrize("method", ["macenko", "reinhard"])
def test_background_only_tiles_fall_back_without_nan(run_dir: Path, tmp_path: Path, method: str) -> None:
    """A slide whose tiles are all glass: no stain fit is possible; every tile is kept as it was, counted."""
    tf = read_tile_file(run_dir / "tiles" / "prov-a.h5")
    glass = []
    with open_slide(tf.slide_path) as slide:
        w, h = slide.dimensions
        for y in range(0, h - 128, 128):
            for x in range(0, w - 128, 128):
                if slide.read_region_um(x, y, TILE_UM, TILE_UM / TILE_PX).min() > 200:
                    glass.append((x, y))
    assert len(glass) >= 3, "the sample slide has blank glass around its tissue"
    run = tmp_path / "run"
    (run / "tiles").mkdir(parents=True)
    coords = np.asarray(glass, np.int64)
    coords_um = (coords * tf.mpp).astype(np.float32)
    meta = replace(tf.meta, counts=replace(tf.meta.counts, n_kept=len(coords)))
    write_tile_file(run / "tiles" / "prov-a.h5", coords=coords, coords_um=coords_um, meta=meta)
    assert _run(run, run, dataclasses.replace(OPTIONS, stain_norm=method)) == ["ok"]
    bag = read_bag(run / BAGS / "prov-a.h5")
    assert len(bag) == len(glass) and np.isfinite(bag.feats).all()
    assert bag.meta["stain_fallback_tiles"] == len(glass)
    # left as they were: the features equal those without stain normalisation
    assert _run(run, tmp_path / "plain", OPTIONS) == ["ok"]
    np.testing.assert_array_equal(read_bag(tmp_path / "plain" / BAGS / "prov-a.h5").feats, bag.feats)

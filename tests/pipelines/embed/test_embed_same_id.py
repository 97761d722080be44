"""An encoder recipe whose file name equals an existing encoder's id never replaces that encoder's bags
without --overwrite: the slide is refused, naming both encoders, and the bag is left as it was."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from wsi.formats.bags import read_bag
from wsi.pipelines.embed import EmbedOptions, embed_tiles
from wsi.pipelines.tile.stage import tile_slides
from wsi.slides.sources import find_slides
from wsi.tiling.grid import TileParams

OPTIONS = EmbedOptions(
    encoder="timm:test_resnet", random_init=True, input_px=64, batch_size=8, readers=0, dtype="float32",
    threads=1,
)  # fmt: skip


def test_a_recipe_named_like_an_encoder_id_does_not_replace_its_bags(make_slide, tmp_path: Path) -> None:
    slide = make_slide(name="same-id", size_um=600.0, mpp=1.0, seed=8)
    params = TileParams(tile_um=128.0, tile_px=32, min_blur_variance=0)
    tile_slides(find_slides([slide.path]), out_dir=tmp_path, params=params, threads=1)
    assert [
        r.status for r in embed_tiles(tiles_dir=tmp_path, out_dir=tmp_path, options=OPTIONS, progress=False)
    ] == ["ok"]
    bag = tmp_path / "features" / "timm-test_resnet" / f"{slide.path.stem}.h5"
    before = bag.read_bytes()
    recipe = tmp_path / "timm-test_resnet.yaml"  # its id is its file name: the packaged encoder's id
    recipe.write_text("arch: test_resnet\ndim: 96\ninput_px: 64\n")
    mine = dataclasses.replace(OPTIONS, encoder=str(recipe))
    (row,) = embed_tiles(tiles_dir=tmp_path, out_dir=tmp_path, options=mine, progress=False)
    assert row.status == "failed"
    assert "holds features of encoder 'timm:test_resnet'" in row.error and "--overwrite" in row.error
    assert bag.read_bytes() == before
    (row,) = embed_tiles(
        tiles_dir=tmp_path,
        out_dir=tmp_path,
        options=dataclasses.replace(mine, overwrite=True),
        progress=False,
    )
    assert row.status == "ok" and read_bag(bag).meta["encoder"] == str(recipe)

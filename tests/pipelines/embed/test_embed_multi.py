"""Several encoders in one pass (issue 12 item 4): each tile is read and decoded once, every encoder gets
its own preprocessing of the same uint8 tiles, one bag folder per encoder, equal to separate runs; resume
is per encoder; the command line pairs --weights with --encoder by order and takes hub model folders."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.torch import save_file

import wsi.pipelines.embed.feed as feed
from wsi.cli.main import cli
from wsi.core.errors import ConfigError
from wsi.formats.bags import read_bag
from wsi.formats.tile_file import read_tile_file
from wsi.models.encoders import build_encoder
from wsi.pipelines.embed import EmbedOptions, EncoderChoice, embed_tiles, results_by_encoder
from wsi.pipelines.tile.stage import tile_slides
from wsi.slides.sources import find_slides
from wsi.tiling.params import TileParams

RESNET = EncoderChoice("timm:test_resnet", input_px=64)  # a CNN resized to 64 px
VIT = EncoderChoice("timm:test_vit")  # a ViT at its own 160 px: another preprocessing of the same tiles
BASE = EmbedOptions(random_init=True, batch_size=8, readers=0, dtype="float32", threads=1, use_cache=False)
TWO = dataclasses.replace(BASE, encoders=(RESNET, VIT))
FOLDERS = {"timm-test_resnet": RESNET, "timm-test_vit": VIT}


def _single(choice: EncoderChoice) -> EmbedOptions:
    return dataclasses.replace(BASE, encoder=choice.name, input_px=choice.input_px)


@pytest.fixture(scope="module")
def run_dir(make_slide, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two small slides at 1 um/px tiled at 4 um/px (128 um, 32 px tiles), no pixel cache."""
    a = make_slide(name="multi-a", size_um=800.0, mpp=1.0, seed=3)
    b = make_slide(name="multi-b", size_um=(700.0, 500.0), mpp=1.0, seed=4, style="b")
    out = tmp_path_factory.mktemp("multi-run")
    params = TileParams(tile_um=128.0, tile_px=32, min_blur_variance=0)
    results = tile_slides(find_slides([a.path, b.path]), out_dir=out, params=params, threads=1)
    assert [r.status for r in results] == ["ok", "ok"]
    return out


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Every tile read from a slide by the embed feed, as (slide path, x, y)."""
    seen: list[tuple[str, int, int]] = []
    real_open = feed.open_slide

    class Counting:
        def __init__(self, slide: Any) -> None:
            self.slide = slide

        def read_region_um(self, x: int, y: int, *args: Any, **kwargs: Any) -> Any:
            seen.append((str(self.slide.path), x, y))
            return self.slide.read_region_um(x, y, *args, **kwargs)

        def close(self) -> None:
            self.slide.close()

    monkeypatch.setattr(feed, "open_slide", lambda *a, **k: Counting(real_open(*a, **k)))
    return seen


def _n_tiles(run: Path) -> int:
    return sum(len(read_tile_file(p)) for p in (run / "tiles").glob("*.h5"))


def _status(results: list) -> dict[str, list[tuple[str, str]]]:
    return {eid: [(r.slide_id, r.status) for r in rows] for eid, rows in results_by_encoder(results).items()}


def test_one_pass_equals_separate_runs_and_reads_each_tile_once(
    run_dir: Path, tmp_path: Path, reads: list[tuple[str, int, int]]
) -> None:
    n = _n_tiles(run_dir)
    results = embed_tiles(tiles_dir=run_dir, out_dir=tmp_path / "one", options=TWO, progress=False)
    assert _status(results) == {eid: [("multi-a", "ok"), ("multi-b", "ok")] for eid in FOLDERS}
    assert len(reads) == n and len(set(reads)) == n  # every tile read once, for both encoders
    reads.clear()
    for choice in FOLDERS.values():
        rows = embed_tiles(tiles_dir=run_dir, out_dir=tmp_path / "apart", options=_single(choice),
                           progress=False)  # fmt: skip
        assert [r.status for r in rows] == ["ok", "ok"]
    assert len(reads) == 2 * n  # what the one pass saves: a second read of every tile
    for folder, choice in FOLDERS.items():
        enc = build_encoder(choice.name, random_init=True, input_px=choice.input_px)
        for slide_id in ("multi-a", "multi-b"):
            one = read_bag(tmp_path / "one" / "features" / folder / f"{slide_id}.h5")
            apart = read_bag(tmp_path / "apart" / "features" / folder / f"{slide_id}.h5")
            assert one.dim == enc.dim and one.meta["input_px"] == enc.input_px
            np.testing.assert_array_equal(one.feats, apart.feats)
            np.testing.assert_array_equal(one.coords_um, apart.coords_um)
            assert one.provenance is not None and one.provenance.encoder == choice.name
            assert one.provenance.recipe_sha256 == enc.recipe.digest()
        with open(tmp_path / "one" / "features" / folder / "manifest.csv", newline="") as fh:
            assert [row["status"] for row in csv.DictReader(fh)] == ["ok", "ok"]


def test_resume_is_per_encoder(run_dir: Path, tmp_path: Path, reads: list[tuple[str, int, int]]) -> None:
    n = _n_tiles(run_dir)
    embed_tiles(tiles_dir=run_dir, out_dir=tmp_path, options=_single(RESNET), progress=False)
    resnet_bag = tmp_path / "features" / "timm-test_resnet" / "multi-a.h5"
    made = resnet_bag.stat().st_mtime_ns
    reads.clear()
    # adding an encoder: the finished bags of the first are skipped, the tiles read once for the new one
    results = embed_tiles(tiles_dir=run_dir, out_dir=tmp_path, options=TWO, progress=False)
    assert _status(results) == {
        "timm-test_resnet": [("multi-a", "skipped"), ("multi-b", "skipped")],
        "timm-test_vit": [("multi-a", "ok"), ("multi-b", "ok")],
    }
    assert resnet_bag.stat().st_mtime_ns == made and len(reads) == n
    # one bag of one encoder gone: only that slide is read, only that bag made
    (tmp_path / "features" / "timm-test_vit" / "multi-b.h5").unlink()
    reads.clear()
    results = embed_tiles(tiles_dir=run_dir, out_dir=tmp_path, options=TWO, progress=False)
    assert _status(results)["timm-test_vit"] == [("multi-a", "skipped"), ("multi-b", "ok")]
    assert len(reads) == len(read_tile_file(run_dir / "tiles" / "multi-b.h5"))
    reads.clear()
    results = embed_tiles(tiles_dir=run_dir, out_dir=tmp_path, options=TWO, progress=False)
    assert {r.status for r in results} == {"skipped"} and not reads


def test_options_refuse_mixed_or_clashing_encoders() -> None:
    with pytest.raises(ConfigError, match="not both"):
        EmbedOptions(encoder="timm:test_resnet", encoders=(VIT,))
    with pytest.raises(ConfigError, match="same bag folder"):
        EmbedOptions(encoders=(VIT, EncoderChoice("timm:test_vit", input_px=96)))
    assert EmbedOptions().choices() == (EncoderChoice("retccl"),)
    assert TWO.choices() == (RESNET, VIT)


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["-q", "embed", *args, "--readers", "0", "--dtype", "float32"])


def test_cli_pairs_weights_with_encoders_by_order_and_takes_model_folders(
    run_dir: Path, tmp_path: Path
) -> None:
    resnet = build_encoder("timm:test_resnet", random_init=True)
    eff = build_encoder("timm:test_efficientnet", random_init=True)
    shifted = {k: v + 0.01 if v.is_floating_point() else v for k, v in resnet.backbone.state_dict().items()}
    save_file(shifted, str(tmp_path / "resnet.safetensors"))
    hub = tmp_path / "hub-efficientnet"  # the authors' hub layout: config.json + model.safetensors
    hub.mkdir()
    save_file(eff.backbone.state_dict(), str(hub / "model.safetensors"))
    (hub / "config.json").write_text('{"architecture": "test_efficientnet", "model_args": {}}')
    out = tmp_path / "out"
    args = ["--tiles", str(run_dir), "--out", str(out), "--input-px", "64",
            "--encoder", "timm:test_resnet", "--weights", str(tmp_path / "resnet.safetensors"),
            "--encoder", "timm:test_efficientnet", "--weights", str(hub), "--batch-size", "auto"]  # fmt: skip
    res = _cli(*args)
    assert res.exit_code == 0, res.output
    assert "embed timm-test_resnet: 2 slides: 2 ok" in res.output
    assert "embed timm-test_efficientnet: 2 slides: 2 ok" in res.output
    from wsi.core.files import sha256_file

    a = read_bag(out / "features" / "timm-test_resnet" / "multi-a.h5")
    b = read_bag(out / "features" / "timm-test_efficientnet" / "multi-a.h5")
    assert a.meta["weights_sha256"] == sha256_file(tmp_path / "resnet.safetensors")
    assert b.meta["weights_sha256"] == sha256_file(hub / "model.safetensors")
    assert (a.dim, b.dim) == (resnet.dim, eff.dim)
    # one --weights for two encoders: a usage error naming the rule, before any work
    one = str(tmp_path / "resnet.safetensors")
    bad = _cli("--tiles", str(run_dir), "--out", str(tmp_path / "bad"), "--encoder", "timm:test_resnet",
               "--encoder", "timm:test_efficientnet", "--weights", one)  # fmt: skip
    assert bad.exit_code == 2 and "one --weights per --encoder" in bad.output
    assert not (tmp_path / "bad" / "features").exists()
    # named encoders fix their input size
    fixed = _cli("--tiles", str(run_dir), "--out", str(tmp_path / "bad"), "--encoder", "retccl",
                 "--random-init", "--input-px", "224")  # fmt: skip
    assert fixed.exit_code == 2 and "input size is fixed" in fixed.output
    auto = _cli("--tiles", str(run_dir), "--out", str(tmp_path / "bad"), "--random-init", "--batch-size", "x")
    assert auto.exit_code == 2 and "batch_size" in auto.output and "Traceback" not in auto.output

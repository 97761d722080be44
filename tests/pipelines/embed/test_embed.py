"""The embed stage: bags equal the encoder on `read_region_um` tiles; bad tiles, resume, dask, CLI."""

from __future__ import annotations

import csv
import dataclasses
import shutil
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from wsi.cli.main import cli
from wsi.core.errors import ConfigError
from wsi.formats.bags import read_bag
from wsi.formats.tile_file import read_tile_file, write_tile_file
from wsi.formats.tile_meta import TileFileMeta
from wsi.models.encoders import build_encoder
from wsi.pipelines.embed import EmbedOptions, embed_tiles
from wsi.pipelines.tile.stage import tile_slides
from wsi.slides.slide import open_slide
from wsi.slides.sources import find_slides
from wsi.tiling.params import TileParams

ENCODER = "timm:test_resnet"  # ~0.4 M parameters: the whole pipeline in well under a second
OPTIONS = EmbedOptions(
    encoder=ENCODER, random_init=True, input_px=64, batch_size=8, readers=0, dtype="float32", threads=1
)
BAGS = "features/timm-test_resnet"


def _tile(slides: list[Path], out: Path, params: TileParams, *, save_tiles: bool = False) -> Path:
    results = tile_slides(find_slides(slides), out_dir=out, params=params, save_tiles=save_tiles, threads=1)
    assert all(r.status == "ok" for r in results), results
    return out


@pytest.fixture(scope="module")
def run_dir(make_slide, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two small slides at 1 um/px tiled at 4 um/px (128 um, 32 px tiles), with the zarr cache."""
    a = make_slide(name="emb-a", size_um=1000.0, mpp=1.0, seed=3)
    b = make_slide(name="emb-b", size_um=(800.0, 600.0), mpp=1.0, seed=4, style="b")
    params = TileParams(tile_um=128.0, tile_px=32, min_blur_variance=0)
    return _tile([a.path, b.path], tmp_path_factory.mktemp("embed-run"), params, save_tiles=True)


@pytest.fixture(scope="module")
def local_run(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("embed-local")
    results = embed_tiles(tiles_dir=run_dir, out_dir=out, options=OPTIONS, progress=False)
    assert [r.status for r in results] == ["ok", "ok"], results
    return out


def _manifest(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as fh:
        return {row["slide"]: row for row in csv.DictReader(fh)}


def test_bags_hold_the_encoder_features_of_the_tile_stage_tiles(run_dir: Path, local_run: Path) -> None:
    enc = build_encoder(ENCODER, random_init=True, input_px=64)
    for slide_id in ("emb-a", "emb-b"):
        tf = read_tile_file(run_dir / "tiles" / f"{slide_id}.h5")
        bag = read_bag(local_run / BAGS / f"{slide_id}.h5")
        assert len(bag) == len(tf) > 5 and bag.dim == enc.dim
        np.testing.assert_array_equal(bag.coords_um, tf.coords_um)
        np.testing.assert_array_equal(bag.coords_px, tf.coords)
        assert bag.tile_um == 128.0 and bag.meta["tile_size_px"] == 32 and bag.meta["mpp"] == 1.0
        assert bag.meta["encoder"] == ENCODER and bag.meta["weights_sha256"] == "random"
        assert bag.meta["n_bad_tiles"] == 0 and bag.meta["pixel_source"] == "tile-cache"
        assert '"tile_um": 128.0' in bag.meta["tile_params"]
        # the whole provenance, as one typed record, every field filled by the embed stage
        prov = bag.provenance
        assert prov is not None and prov.tile_params == tf.params and prov.tile_file == str(tf.path)
        assert (prov.encoder_id, prov.input_px, prov.precision) == ("timm-test_resnet", 64, "fp32")
        assert (prov.n_tiles_requested, prov.target_mpp, prov.slide_path) == (len(tf), 4.0, tf.slide_path)
        assert (prov.level0_width, prov.level0_height) == (tf.meta.level0_width, tf.meta.level0_height)
        # the same pixels the tile stage saw, through the one reading function
        with open_slide(tf.slide_path) as slide:
            pixels = np.stack([slide.read_region_um(int(x), int(y), 128.0, 4.0) for x, y in tf.coords[:6]])
        with torch.inference_mode():
            expected = enc.embed(torch.from_numpy(pixels)).numpy()
        np.testing.assert_allclose(bag.feats[:6], expected, rtol=1e-4, atol=1e-5)
    rows = _manifest(local_run / BAGS / "manifest.csv")
    assert rows["emb-a"]["status"] == "ok" and int(rows["emb-a"]["tiles"]) == len(
        read_bag(local_run / BAGS / "emb-a.h5")
    )


@pytest.mark.parametrize("reader_mode", ["process", "thread"])
def test_slide_reads_equal_the_tile_cache(
    run_dir: Path, local_run: Path, tmp_path: Path, reader_mode: str
) -> None:
    # two background readers (processes or threads) reading from the slides, not the zarr cache
    options = dataclasses.replace(OPTIONS, use_cache=False, readers=2, reader_mode=reader_mode, batch_size=4)
    results = embed_tiles(tiles_dir=run_dir, out_dir=tmp_path, options=options, progress=False)
    assert [r.status for r in results] == ["ok", "ok"]
    for slide_id in ("emb-a", "emb-b"):
        from_slide = read_bag(tmp_path / BAGS / f"{slide_id}.h5")
        cached = read_bag(local_run / BAGS / f"{slide_id}.h5")
        assert from_slide.meta["pixel_source"] == "slide"
        np.testing.assert_allclose(from_slide.feats, cached.feats, rtol=1e-4, atol=1e-5)


def test_broken_jpeg_tile_is_skipped_and_counted(make_slide, tmp_path: Path) -> None:
    # Tiles of 128 um at 0.5 um/px are read from level 0 and line up with the 256 px JPEG tiles, so
    # damaging JPEG tile (3, 1) breaks exactly one of our tiles. The tiling ran on the intact slide;
    # the embedding reads the damaged copy (a file that went bad after tiling).
    clean = make_slide(name="emb-clean", size_um=640.0, mpp=0.5, seed=0)
    broken = make_slide(name="emb-broken", size_um=640.0, mpp=0.5, seed=0, corrupt_tiles=[(3, 1)])
    run = _tile([clean.path], tmp_path, TileParams(tile_um=128.0, tile_px=256, min_blur_variance=0))
    h5 = run / "tiles" / "emb-clean.h5"
    tf = read_tile_file(h5)
    bad_xy = (768, 256)
    assert bad_xy in {tuple(c) for c in tf.coords.tolist()}, "the damaged tile must be one of the kept tiles"
    write_tile_file(
        h5, coords=tf.coords, coords_um=tf.coords_um, meta=replace(tf.meta, slide_path=str(broken.path))
    )

    results = embed_tiles(tiles_dir=run, out_dir=run, options=OPTIONS, progress=False)
    assert results[0].status == "ok", results
    bag = read_bag(run / BAGS / "emb-clean.h5")
    assert bag.meta["n_bad_tiles"] == 1 and len(bag) == len(tf) - 1
    assert bad_xy not in {tuple(c) for c in bag.coords_px.tolist()}
    assert bag.meta["pixel_source"] == "slide"

    # with no tolerance the slide fails, with the reason in the manifest and a non-zero exit code
    runner = CliRunner()
    args = ["-q", "embed", "--tiles", str(run), "--out", str(tmp_path / "strict"), "--encoder", ENCODER,
            "--random-init", "--input-px", "64", "--readers", "0", "--max-bad-tiles", "0"]  # fmt: skip
    result = runner.invoke(cli, args)
    assert result.exit_code == 1, result.output
    row = _manifest(tmp_path / "strict" / BAGS / "manifest.csv")["emb-clean"]
    assert row["status"] == "failed" and "1 of" in row["error"] and "--max-bad-tiles" in row["error"]
    assert not (tmp_path / "strict" / BAGS / "emb-clean.h5").exists()


def test_resume_after_an_interrupted_run(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wsi.pipelines.embed.engine as engine

    shutil.copytree(run_dir / "tiles", tmp_path / "tiles")  # this test edits a tile file
    real_write = engine.write_bag
    calls = []

    def write_then_die(path: Path, **kwargs: object) -> Path:
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user pressed Ctrl-C while the second bag was written
        return real_write(path, **kwargs)

    def run(options: EmbedOptions = OPTIONS) -> list[tuple[str, str]]:
        results = embed_tiles(tiles_dir=tmp_path, out_dir=tmp_path, options=options, progress=False)
        return [(r.slide_id, r.status) for r in results]

    monkeypatch.setattr(engine, "write_bag", write_then_die)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.setattr(engine, "write_bag", real_write)
    bags = tmp_path / BAGS
    assert [p.name for p in bags.glob("*.h5")] == ["emb-a.h5"]
    first = (bags / "emb-a.h5").stat().st_mtime_ns

    assert run() == [("emb-a", "skipped"), ("emb-b", "ok")]
    assert (bags / "emb-a.h5").stat().st_mtime_ns == first
    assert not [p for p in bags.iterdir() if p.name.startswith(".")]  # no temp files left
    assert run() == [("emb-a", "skipped"), ("emb-b", "skipped")]

    # a re-tiled slide makes its bag stale
    h5 = tmp_path / "tiles" / "emb-a.h5"
    tf = read_tile_file(h5)
    shutil.rmtree(h5.with_suffix(".zarr"))
    write_tile_file(
        h5, coords=tf.coords[:-1], coords_um=tf.coords_um[:-1], meta=_with_kept(tf.meta, len(tf) - 1)
    )
    assert run() == [("emb-a", "ok"), ("emb-b", "skipped")]
    assert len(read_bag(bags / "emb-a.h5")) == len(tf) - 1

    # other weights make the old bags stale; --overwrite redoes bags from the same weights
    enc = build_encoder(ENCODER, random_init=True)
    weights = tmp_path / "w.safetensors"
    save_file(
        {k: v + 0.01 if v.is_floating_point() else v for k, v in enc.backbone.state_dict().items()},
        str(weights),
    )
    other = dataclasses.replace(OPTIONS, random_init=False, weights=str(weights))
    assert run(other) == [("emb-a", "ok"), ("emb-b", "ok")]
    assert read_bag(bags / "emb-a.h5").meta["weights_sha256"] != "random"
    assert run(dataclasses.replace(other, overwrite=True)) == [("emb-a", "ok"), ("emb-b", "ok")]
    # so do another encoder input size and another on-disk dtype
    assert run(dataclasses.replace(other, input_px=96)) == [("emb-a", "ok"), ("emb-b", "ok")]
    assert read_bag(bags / "emb-a.h5").meta["input_px"] == 96
    assert run(dataclasses.replace(other, input_px=96, dtype="float16")) == [("emb-a", "ok"), ("emb-b", "ok")]
    assert read_bag(bags / "emb-a.h5").feats.dtype == np.float16
    assert run(dataclasses.replace(other, input_px=96, dtype="float16")) == [
        ("emb-a", "skipped"), ("emb-b", "skipped"),
    ]  # fmt: skip


def test_ctrl_c_keeps_the_finished_bags_in_the_manifest(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the second slide is embedded: the first one's bag is written whole and is in the
    encoder's manifest.csv; the rerun skips it."""
    import wsi.pipelines.embed.engine as engine

    shutil.copytree(run_dir / "tiles", tmp_path / "tiles")
    real = engine._encode_batch

    def ctrl_c_at_slide_1(acc, work, runtimes, batch, norm):  # type: ignore[no-untyped-def]
        if batch.slide_index == 1:
            raise KeyboardInterrupt
        return real(acc, work, runtimes, batch, norm)

    monkeypatch.setattr(engine, "_encode_batch", ctrl_c_at_slide_1)
    with pytest.raises(KeyboardInterrupt):
        embed_tiles(tiles_dir=tmp_path, out_dir=tmp_path, options=OPTIONS, progress=False)
    with open(tmp_path / BAGS / "manifest.csv", newline="") as fh:
        rows = [(r["slide"], r["status"], int(r["tiles"])) for r in csv.DictReader(fh)]
    assert rows == [("emb-a", "ok", len(read_bag(tmp_path / BAGS / "emb-a.h5")))]
    assert [p.name for p in (tmp_path / BAGS).glob("*.h5")] == ["emb-a.h5"]

    monkeypatch.setattr(engine, "_encode_batch", real)
    results = embed_tiles(tiles_dir=tmp_path, out_dir=tmp_path, options=OPTIONS, progress=False)
    assert [(r.slide_id, r.status) for r in results] == [("emb-a", "skipped"), ("emb-b", "ok")]


def test_nan_features_fail_the_slide(run_dir: Path, tmp_path: Path) -> None:
    enc = build_encoder(ENCODER, random_init=True)
    state = {k: v.clone() for k, v in enc.backbone.state_dict().items()}
    first_conv = next(k for k in state if k.endswith("weight") and state[k].ndim == 4)
    state[first_conv][0] = float("nan")
    save_file(state, str(tmp_path / "nan.safetensors"))
    options = dataclasses.replace(OPTIONS, random_init=False, weights=str(tmp_path / "nan.safetensors"))
    results = embed_tiles(tiles_dir=run_dir, out_dir=tmp_path, options=options, progress=False)
    assert [r.status for r in results] == ["failed", "failed"]
    assert "NaN or infinite features" in results[0].error
    assert not list((tmp_path / BAGS).glob("*.h5"))


def test_dask_cluster_run_equals_the_local_run(run_dir: Path, local_run: Path, tmp_path: Path) -> None:
    from distributed import LocalCluster

    # a real cluster of worker processes, reached by address as with --scheduler
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        results = embed_tiles(
            tiles_dir=run_dir, out_dir=tmp_path, options=OPTIONS, scheduler=cluster.scheduler_address,
            progress=False,
        )  # fmt: skip
    assert [r.status for r in results] == ["ok", "ok"], results
    for slide_id in ("emb-a", "emb-b"):
        remote = read_bag(tmp_path / BAGS / f"{slide_id}.h5")
        local = read_bag(local_run / BAGS / f"{slide_id}.h5")
        np.testing.assert_array_equal(remote.coords_um, local.coords_um)
        np.testing.assert_allclose(remote.feats, local.feats, rtol=1e-4, atol=1e-5)


def test_cli_usage_errors_and_info(run_dir: Path, local_run: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    no_weights = runner.invoke(cli, ["embed", "--tiles", str(run_dir), "--out", str(tmp_path)])
    assert no_weights.exit_code == 2 and "--random-init" in no_weights.output
    neither = runner.invoke(cli, ["embed", "--out", str(tmp_path), "--random-init"])
    assert neither.exit_code == 2 and "either --tiles" in neither.output
    info = runner.invoke(
        cli, ["info", str(local_run / BAGS / "emb-a.h5"), str(run_dir / "tiles" / "emb-a.h5")]
    )
    assert info.exit_code == 0, info.output
    assert "feature bag (wsi layout)" in info.output and "tile file (wsi-tiles)" in info.output
    assert "timm:test_resnet" in info.output and "weights_sha256" in info.output
    with h5py.File(local_run / BAGS / "emb-a.h5") as h5:
        assert f"tiles             {h5['feats'].shape[0]}" in info.output


def test_cli_embeds_slides_directly(make_slide, tmp_path: Path) -> None:
    slide = make_slide(name="emb-direct", size_um=600.0, mpp=0.5, seed=5)
    args = ["-q", "embed", str(slide.path), "--out", str(tmp_path), "--encoder", ENCODER, "--random-init",
            "--input-px", "64", "--readers", "0", "--tile-um", "128", "--tile-px", "32"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert f" -> {tmp_path / BAGS}\n" in result.output  # the folder `wsi train --features` takes
    assert (tmp_path / "tiles" / "emb-direct.h5").is_file()
    bag = read_bag(tmp_path / BAGS / "emb-direct.h5")
    assert len(bag) == len(read_tile_file(tmp_path / "tiles" / "emb-direct.h5")) > 0


def test_embed_options_are_a_validated_config() -> None:
    from wsi.core.config import config_dict, parse_config

    given = {"encoder": ENCODER, "batch_size": "16", "decode": "cpu"}
    options = parse_config(EmbedOptions, given, source="t")
    assert options.batch_size == 16 and options.decode == "cpu" and options.readers >= 1
    with pytest.raises(ConfigError, match="unknown field 'batch'"):
        parse_config(EmbedOptions, {"batch": 16}, source="t")
    with pytest.raises(ConfigError, match="precision"):
        parse_config(EmbedOptions, {"precision": "fp8"}, source="t")
    with pytest.raises(ConfigError, match="max_bad_tiles"):
        parse_config(EmbedOptions, {"max_bad_tiles": 1.5}, source="t")
    assert parse_config(EmbedOptions, config_dict(OPTIONS), source="t") == OPTIONS


def test_padding_and_autocast_paths_match_plain_fp32() -> None:
    """The CUDA-side mechanics (fixed-shape padding, autocast), exercised on the CPU."""
    from wsi.pipelines.embed.engine import encode, prepare_runtime

    enc = build_encoder(ENCODER, random_init=True, input_px=64)
    rt = prepare_runtime(enc, device=torch.device("cpu"), precision="bf16", batch_size=8)
    assert rt.autocast is None and rt.pad_to is None  # the CPU runs fp32, unpadded
    tiles = torch.randint(
        0, 256, (3, 32, 32, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    plain = encode(rt, tiles)
    padded = encode(dataclasses.replace(rt, pad_to=8), tiles)
    assert padded.shape == (3, enc.dim) and padded.dtype == torch.float32
    torch.testing.assert_close(padded, plain, rtol=1e-4, atol=1e-5)
    bf16 = encode(dataclasses.replace(rt, autocast=torch.bfloat16), tiles)
    torch.testing.assert_close(bf16, plain, rtol=0.1, atol=0.05)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_run_matches_the_cpu_run(run_dir: Path, local_run: Path, tmp_path: Path) -> None:
    for precision in ("bf16", "fp32"):
        options = dataclasses.replace(OPTIONS, device="cuda", precision=precision, readers=2)
        out = tmp_path / precision
        assert [r.status for r in embed_tiles(tiles_dir=run_dir, out_dir=out, options=options)] == [
            "ok",
            "ok",
        ]
        gpu, cpu = read_bag(out / BAGS / "emb-a.h5"), read_bag(local_run / BAGS / "emb-a.h5")
        assert gpu.meta["precision"] == precision
        tol = 1e-3 if precision == "fp32" else 0.1
        np.testing.assert_allclose(gpu.feats, cpu.feats, rtol=tol, atol=tol)


def _with_kept(meta: TileFileMeta, n: int) -> TileFileMeta:
    return replace(meta, counts=replace(meta.counts, n_kept=n))

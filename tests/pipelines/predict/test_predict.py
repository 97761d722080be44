"""Batch inference: probabilities equal the model's own, heatmaps, failures recorded, encoder checks,
raw slides through tile -> embed -> classify with the run's recorded settings."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from cohorts import make_bag, make_cohort, write_task
from safetensors.torch import load_file

from wsi.cli.main import cli
from wsi.core.errors import ConfigError
from wsi.formats.bags import read_bag
from wsi.formats.tile_values import read_tile_values
from wsi.models.presets import build_model_from_config
from wsi.pipelines.predict.stage import predict
from wsi.pipelines.train import train

PNG = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("predict")
    cohort = make_cohort(root, n_patients=12)
    task = write_task(root / "task.yaml", epochs=4)
    result = train(
        task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=root / "run", progress=False
    )
    return cohort, result.run_dir


def _read(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open()))


def test_bag_probabilities_equal_the_models_own_outputs(trained, tmp_path: Path) -> None:
    cohort, run = trained
    result = predict(model_dir=run, features_dir=cohort.bags, out_dir=tmp_path / "out", progress=False)
    config = json.loads((run / "config.json").read_text())
    model = build_model_from_config(config["model"])
    model.load_state_dict(load_file(run / "best.safetensors"))
    model.eval()
    rows = {r["slide"]: r for r in _read(result.predictions_csv)}
    assert set(rows) == set(cohort.slides)
    for slide in cohort.slides:
        bag = read_bag(cohort.bags / f"{slide}.h5")
        with torch.no_grad():
            x = torch.from_numpy(bag.feats).float()[None]  # (1, N, D)
            probs = torch.softmax(model(x, coords_um=torch.from_numpy(bag.coords_um)[None]), -1)[0].numpy()
        got = np.array([float(rows[slide]["prob_LUAD"]), float(rows[slide]["prob_LUSC"])])
        np.testing.assert_allclose(got, probs, atol=1e-6)
        assert rows[slide]["predicted"] == ("LUAD", "LUSC")[int(probs.argmax())]
        assert (tmp_path / "out" / "heatmaps" / f"{slide}.png").read_bytes()[:8] == PNG
        values = read_tile_values(tmp_path / "out" / "heatmaps" / f"{slide}.json")  # what `wsi view` draws
        np.testing.assert_allclose(values.coords_um, bag.coords_um, atol=1e-3)
        assert values.predicted == rows[slide]["predicted"] and set(values.outputs) == {"LUAD", "LUSC"}
        np.testing.assert_allclose(values.outputs["LUAD"], -values.outputs["LUSC"], rtol=1e-5, atol=1e-7)
    assert {r["status"] for r in _read(tmp_path / "out" / "manifest.csv")} == {"ok"}


def test_a_broken_bag_is_recorded_and_the_batch_goes_on(trained, tmp_path: Path) -> None:
    cohort, run = trained
    bags = tmp_path / "bags"
    bags.mkdir()
    for slide in cohort.slides[:3]:
        (bags / f"{slide}.h5").write_bytes((cohort.bags / f"{slide}.h5").read_bytes())
    (bags / "broken.h5").write_bytes(b"not an hdf5 file at all")
    runner = CliRunner()
    res = runner.invoke(
        cli,
        [
            "predict",
            "--model",
            str(run),
            "--features",
            str(bags),
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ],
    )
    assert res.exit_code == 1, res.output
    manifest = {r["slide"]: r for r in _read(tmp_path / "out" / "manifest.csv")}
    assert manifest["broken"]["status"] == "failed" and "broken.h5" in manifest["broken"]["error"]
    assert [manifest[s]["status"] for s in cohort.slides[:3]] == ["ok"] * 3
    assert len(_read(tmp_path / "out" / "predictions.csv")) == 3


def test_bags_from_another_encoder_are_refused(trained, tmp_path: Path) -> None:
    cohort, run = trained
    bags = tmp_path / "bags"
    bags.mkdir()
    (bags / "ok.h5").write_bytes((cohort.bags / f"{cohort.slides[0]}.h5").read_bytes())
    make_bag(bags / "other.h5", label=0, rng=np.random.default_rng(0), n=5, encoder="timm:resnet18")
    with pytest.raises(ConfigError, match=r"test-encoder.*other\.h5: encoder timm:resnet18"):
        predict(model_dir=run, features_dir=bags, out_dir=tmp_path / "out", progress=False)
    make_bag(bags / "other.h5", label=0, rng=np.random.default_rng(0), n=5, sha="f" * 64)
    with pytest.raises(ConfigError, match="weights_sha256"):
        predict(model_dir=run, features_dir=bags, out_dir=tmp_path / "out", progress=False)
    runner = CliRunner()
    res = runner.invoke(
        cli, ["predict", "--model", str(run), "--features", str(bags), "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 2 and "differ" in res.output


def test_usage_errors(trained, tmp_path: Path) -> None:
    cohort, run = trained
    with pytest.raises(ConfigError, match=r"config\.json"):
        predict(model_dir=tmp_path, features_dir=cohort.bags, out_dir=tmp_path / "o")
    with pytest.raises(ConfigError, match="not both"):
        predict(model_dir=run, inputs=[tmp_path], features_dir=cohort.bags, out_dir=tmp_path / "o")
    # the run's bags came from a test encoder with a recorded digest: raw slides need its weights
    with pytest.raises(ConfigError, match="--weights"):
        predict(model_dir=run, inputs=[tmp_path], out_dir=tmp_path / "o")
    res = CliRunner().invoke(cli, ["predict", "--help"])
    assert res.exit_code == 0 and "Examples:" in res.output


@pytest.mark.slow
def test_raw_slides_reproduce_the_runs_feature_extraction(tmp_path: Path) -> None:
    """Train on bags made by tile + embed; predicting the raw slides gives the same probabilities as
    predicting their bags (so tile size, MPP, tiling parameters and encoder were all reproduced)."""
    from wsi.pipelines.embed.engine import EmbedOptions
    from wsi.pipelines.embed.stage import tile_and_embed
    from wsi.slides.sources import find_slides
    from wsi.synthetic import write_sample_cohort
    from wsi.tiling.params import TileParams

    slides = write_sample_cohort(tmp_path / "slides", n=4, size_um=800, mpp=1.0, styles=("a", "b"))
    options = EmbedOptions(encoder="timm:resnet18", random_init=True, input_px=32, device="cpu", readers=0)
    tile_and_embed(
        find_slides([tmp_path / "slides"]),
        out_dir=tmp_path / "emb",
        options=options,
        tile_params=TileParams(tile_um=96, tile_px=32, min_blur_variance=0),
        progress=False,
    )
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "slide,label\n" + "".join(f"{s.path.stem},{('LUAD', 'LUSC')[i % 2]}\n" for i, s in enumerate(slides))
    )
    task = write_task(tmp_path / "task.yaml", epochs=2)
    bags = tmp_path / "emb" / "features" / "timm-resnet18"
    train(task=task, labels_csv=labels, features_dir=bags, out_dir=tmp_path / "run", progress=False)
    prov = json.loads((tmp_path / "run" / "config.json").read_text())["input"]["provenance"]
    assert prov["encoder"] == "timm:resnet18" and prov["weights_sha256"] == "random"
    assert prov["tile_params"]["tile_um"] == 96 and prov["input_px"] == 32

    targets = [slides[0].path, slides[3].path, tmp_path / "slides" / "missing.svs"]
    (tmp_path / "slides" / "missing.svs").write_bytes(b"not a slide")
    from_slides = predict(model_dir=tmp_path / "run", inputs=targets, out_dir=tmp_path / "p1", progress=False)
    from_bags = predict(
        model_dir=tmp_path / "run", features_dir=bags, out_dir=tmp_path / "p2", progress=False
    )
    by_bag = {r["slide"]: r for r in from_bags.rows}
    assert [r["slide"] for r in from_slides.rows] == [slides[0].path.stem, slides[3].path.stem]
    for row in from_slides.rows:
        for c in ("prob_LUAD", "prob_LUSC"):
            assert row[c] == pytest.approx(by_bag[row["slide"]][c], abs=1e-5)
        assert (tmp_path / "p1" / "heatmaps" / f"{row['slide']}.png").read_bytes()[:8] == PNG
    failed = [r for r in from_slides.results if r.status == "failed"]
    assert [r.slide_id for r in failed] == ["missing"]


def test_raw_slides_are_drawn_at_the_resolution_they_were_tiled_at(make_slide, tmp_path: Path) -> None:
    """--mpp serves slides without resolution metadata; a slide with one is tiled at its own, so its
    heatmap and top tiles must open it at that one too, not at --mpp (tiles drawn at 2x their place)."""
    from wsi.pipelines.predict.config import PredictOptions
    from wsi.pipelines.predict.raw_slides import embed_raw_slides

    slide = make_slide(name="has-mpp", size_um=600.0, mpp=0.5, seed=1)
    provenance = {
        "encoder": "timm:test_resnet", "weights_sha256": "random", "input_px": 32,
        "tile_params": {"tile_um": 96.0, "tile_px": 32, "min_blur_variance": 0.0},
    }  # fmt: skip
    bags, thumbs, failed = embed_raw_slides(
        provenance, [slide.path], tmp_path / "work", PredictOptions(mpp=0.25, device="cpu", progress=False)
    )
    assert failed == [] and set(bags) == {"has-mpp"}
    assert read_bag(bags["has-mpp"]).provenance.mpp == pytest.approx(0.5)  # tiled at the metadata's
    assert thumbs["has-mpp"] == (slide.path, pytest.approx(0.5))  # and drawn at it, not at --mpp 0.25

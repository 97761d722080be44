"""`wsi predict` writes geojson/<slide>.geojson: one QuPath tile object per bag tile at its level-0
place, with each tile's contribution (adding up to the slide's log-odds) and pooling weight, the top
tiles as annotations and the prediction in the properties; QuPath's reader rules hold."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from cohorts import make_cohort, write_task
from qupath_rules import parse_file
from safetensors.torch import load_file

from wsi.formats.bags import read_bag
from wsi.models.presets import build_model_from_config
from wsi.pipelines.predict.geojson import slide_collection
from wsi.pipelines.predict.stage import predict
from wsi.pipelines.train import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def predicted(tmp_path_factory: pytest.TempPathFactory):
    """A tiny gated-attention MIL (pooling weights) trained on generated bags, then predicted."""
    root = tmp_path_factory.mktemp("predict-geojson")
    cohort = make_cohort(root, n_patients=6)
    model = {"preset": "abmil", "overrides": {"hidden_dim": 16, "attn_dim": 8, "dropout": 0.0}}
    task = write_task(root / "task.yaml", epochs=2, model=model, bootstrap=20)
    run = train(
        task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=root / "run", progress=False
    )
    out = root / "out"
    # without the PNG heatmaps (seconds of drawing): the GeoJSON does not need them
    predict(model_dir=run.run_dir, features_dir=cohort.bags, out_dir=out, progress=False, heatmaps=False)
    return cohort, run.run_dir, out


def test_one_geojson_per_slide_with_one_tile_per_bag_tile(predicted) -> None:
    cohort, run_dir, out = predicted
    config = json.loads((run_dir / "config.json").read_text())
    model = build_model_from_config(config["model"])
    model.load_state_dict(load_file(run_dir / "best.safetensors"))
    model.eval()
    bias = model.head.bias.detach().numpy()
    rows = {r["slide"]: r for r in csv.DictReader((out / "predictions.csv").open())}
    assert sorted(p.stem for p in (out / "geojson").glob("*.geojson")) == sorted(cohort.slides)
    assert not (out / "heatmaps").exists()
    for slide in cohort.slides:
        bag = read_bag(cohort.bags / f"{slide}.h5")
        objects = parse_file(out / "geojson" / f"{slide}.geojson")  # QuPath's reader rules
        tiles = [o for o in objects if o["objectType"] == "tile"]
        assert len(tiles) == len(bag)
        corners = np.array([o["rings"][0][0] for o in tiles])
        np.testing.assert_allclose(corners, bag.coords_um / 0.5)  # level-0 px (mpp 0.5), bag order
        sides = np.array([np.ptp(np.array(o["rings"][0]), axis=0) for o in tiles])
        np.testing.assert_allclose(sides, 256.0 / 0.5)
        m = {k: np.array([o["measurements"][k] for o in tiles]) for k in tiles[0]["measurements"]}
        assert set(m) == {"contribution LUAD", "contribution LUSC", "pooling weight"}
        # two classes: each tile's contribution is its share of the log-odds; with the head's bias they add up
        log_odds = math.log(float(rows[slide]["prob_LUSC"]) / float(rows[slide]["prob_LUAD"]))
        assert m["contribution LUSC"].sum() + bias[1] - bias[0] == pytest.approx(log_odds, abs=1e-4)
        np.testing.assert_allclose(m["contribution LUAD"], -m["contribution LUSC"], atol=1e-6)
        with torch.no_grad():
            weights = model.attention_weights(torch.from_numpy(bag.feats).float()[None])[0].numpy()
        np.testing.assert_allclose(m["pooling weight"], weights, atol=1e-6)
        top = [o for o in objects if o["objectType"] == "annotation"]
        k = min(5, len(bag))
        assert len(top) == 2 * 2 * k  # most and least, per class
        most = [o for o in top if o["classification"] == "most LUSC"]
        best = np.sort(m["contribution LUSC"])[::-1][:k]
        got = sorted((o["measurements"]["contribution LUSC"] for o in most), reverse=True)
        np.testing.assert_allclose(got, best, atol=1e-6)
        props = json.loads((out / "geojson" / f"{slide}.geojson").read_text())["properties"]
        assert props["prediction"]["predicted"] == rows[slide]["predicted"]
        assert props["prediction"]["prob_LUSC"] == pytest.approx(float(rows[slide]["prob_LUSC"]), abs=1e-6)


def test_collection_without_weights_and_with_effects() -> None:
    coords = np.array([[0.0, 0.0], [10.0, 0.0]])
    maps = {"risk": np.array([0.5, -0.25])}
    collection = slide_collection(
        slide_id="s", coords_px=coords, size_px=10.0, maps=maps, prediction={"risk": 0.25}, k=1,
        effects={"risk": np.array([0.1, math.nan])},
    )  # fmt: skip
    tiles = [f for f in collection["features"] if f["properties"]["objectType"] == "tile"]
    assert [t["properties"]["measurements"] for t in tiles] == [
        {"contribution risk": 0.5, "tile effect risk": 0.1},
        {"contribution risk": -0.25, "tile effect risk": "NaN"},
    ]
    names = [f["properties"].get("name") for f in collection["features"][2:]]
    assert names == ["most risk #1", "least risk #1"]

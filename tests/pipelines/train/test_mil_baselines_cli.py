"""TransMIL, CLAM-SB/MB, DSMIL and DTFD-MIL through the command line (issue 32): `wsi train` from a task
that names the preset (and `--preset`; TransMIL with `--cv 2`: the folds are the same for every model,
so one pays for them), the report, `wsi predict` from bags with heatmaps, tile
values and QuPath GeoJSON (the model's attention for TransMIL, exact contributions for the others),
streamed prediction equal to the in-memory one, and raw slides through tile -> embed -> model."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from cohorts import CLASSES, make_cohort, write_task

from wsi.cli.main import cli
from wsi.formats.bags import read_bag
from wsi.pipelines.predict.stage import load_run, predict

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PRESETS = ("transmil", "clam-sb", "clam-mb", "dsmil", "dtfd")
TINY: dict[str, dict[str, Any]] = {
    "transmil": {"dim": 16, "heads": 2, "landmarks": 8},
    "clam-sb": {"hidden_dim": 16, "attn_dim": 8},
    "clam-mb": {"hidden_dim": 16, "attn_dim": 8},
    "dsmil": {"query_dim": 8},
    "dtfd": {"hidden_dim": 16, "attn_dim": 8},
}
PNG = b"\x89PNG\r\n\x1a\n"
CV = {"transmil": ["--cv", "2"]}


def _task(path: Path, preset: str, **changes: Any) -> Path:
    model = {"preset": preset, "overrides": TINY[preset]}
    return write_task(path, **{"model": model, "epochs": 2, "patience": 2, "bootstrap": 20, **changes})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Path], Path]:
    """Each preset trained by `wsi train` on one synthetic cohort of bags (TransMIL with --cv 2), and a
    folder of three of its bags to predict (heatmaps cost a second or two per slide)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("baselines")
    cohort = make_cohort(root / "cohort", n_patients=10)
    few = root / "few"
    few.mkdir()
    for slide in cohort.slides[:3]:
        shutil.copy(cohort.bags / f"{slide}.h5", few / f"{slide}.h5")
    out = {}
    for preset in PRESETS:
        task = _task(root / f"{preset}.yaml", preset)
        args = ["train", "--task", str(task), "--features", str(cohort.bags), "--labels", str(cohort.labels),
                "--out", str(root / preset), "--no-progress", *CV.get(preset, [])]  # fmt: skip
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, (preset, result.output)
        assert ("2-fold AUROC" if preset in CV else "best epoch") in result.output
        out[preset] = root / preset
    return cohort, out, few


@pytest.mark.parametrize("preset", PRESETS)
def test_training_writes_the_run_folders_and_report(runs, preset: str) -> None:
    _, dirs, _ = runs
    run = dirs[preset]
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["kind"] == preset.replace("-", "_") and config["model"]["in_dim"] == 16
    metrics = json.loads((run / "metrics.json").read_text())
    assert (run / "report.html").is_file()
    if preset in CV:
        assert metrics["folds"] == 2 and len(metrics["per_fold"]) == 2
    folds = [run / f"fold-{k}" for k in (1, 2)] if preset in CV else [run]
    for fold in folds:
        log = (fold / "log.csv").read_text().splitlines()
        assert len(log) == 3 and np.isfinite(float(log[-1].split(",")[1]))  # header + 2 epochs, finite loss
        assert (fold / "best.safetensors").is_file()


@pytest.mark.parametrize("preset", PRESETS)
def test_predict_draws_heatmaps_tile_values_and_geojson(runs, preset: str, tmp_path: Path) -> None:
    cohort, dirs, few = runs
    result = CliRunner().invoke(cli, ["predict", "--model", str(dirs[preset]), "--features", str(few),
                                      "--out", str(tmp_path / "p"), "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    with (tmp_path / "p" / "predictions.csv").open() as fh:
        rows = {r["slide"]: r for r in csv.DictReader(fh)}
    assert set(rows) == set(cohort.slides[:3])
    slide = cohort.slides[0]
    assert (tmp_path / "p" / "heatmaps" / f"{slide}.png").read_bytes()[:8] == PNG
    values = json.loads((tmp_path / "p" / "heatmaps" / f"{slide}.json").read_text())
    geo = json.loads((tmp_path / "p" / "geojson" / f"{slide}.geojson").read_text())
    tile = next(f for f in geo["features"] if f["properties"]["objectType"] == "tile")
    names = set(tile["properties"]["measurements"])
    # what predict drew, against the models' own explanation of the bag (mean over the folds' models)
    run = load_run(dirs[preset], device="cpu")
    bag = read_bag(cohort.bags / f"{slide}.h5")
    x = torch.from_numpy(bag.feats).float()[None]
    with torch.no_grad():
        probs = torch.stack([k.outputs(m(x)) for m, k in zip(run.models, run.kinds, strict=True)])
        probs = probs.mean(0)[0].numpy()  # DSMIL: its one output's sigmoid (the authors' scoring)
        if preset == "transmil":
            want = torch.stack([m.attention_weights(x)[0] for m in run.models]).mean(0).numpy()
        else:
            pred = int(probs.argmax())
            c = torch.stack([m.tile_contributions(x)[0] for m in run.models]).mean(0).numpy()
            c = run.kind.class_scores(c)  # one output for two classes: (0, its contribution)
            want = c[:, pred] - c[:, 1 - pred]  # two classes: the predicted one against the other
    np.testing.assert_allclose([float(rows[slide][f"prob_{c}"]) for c in CLASSES], probs, atol=1e-5)
    heatmaps, _ = run.explain(x, {}, probs)
    np.testing.assert_allclose(heatmaps[0][1], want, rtol=1e-4, atol=1e-6)
    if preset == "transmil":  # no contributions: its attention, named so
        assert "attention" in values["outputs"] and names == {"attention"}
    else:
        assert set(values["outputs"]) == set(CLASSES)
        assert {f"contribution {c}" for c in CLASSES} | {"pooling weight"} <= names


@pytest.mark.parametrize("preset", PRESETS)
def test_streamed_prediction_equals_the_in_memory_one(
    runs, preset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bags above --stream-above-tiles are read chunk by chunk (DSMIL and DTFD-MIL read them twice)."""
    from wsi.pipelines.predict import stage

    streamed_ids: list[str] = []

    def spy(run: Any, case: Any, **kw: Any) -> Any:
        streamed_ids.append(case.id)
        return real(run, case, read_tiles=4)  # several chunks per bag

    real = stage.streamed_outputs
    monkeypatch.setattr(stage, "streamed_outputs", spy)
    _, dirs, few = runs
    whole = predict(model_dir=dirs[preset], features_dir=few, out_dir=tmp_path / "a", progress=False,
                    heatmaps=False, geojson=False, stream_above_tiles=None)  # fmt: skip
    streamed = predict(model_dir=dirs[preset], features_dir=few, out_dir=tmp_path / "b",
                       progress=False, heatmaps=False, geojson=False, stream_above_tiles=3)  # fmt: skip
    a, b = ({r["slide"]: r for r in p.rows} for p in (whole, streamed))
    assert streamed.rows and set(a) == set(b) == set(streamed_ids)
    for slide in a:
        for c in CLASSES:
            assert float(b[slide][f"prob_{c}"]) == pytest.approx(float(a[slide][f"prob_{c}"]), abs=1e-5)


def test_preset_option_and_refusal_of_other_task_kinds(runs, tmp_path: Path) -> None:
    cohort, _, _ = runs
    task = write_task(tmp_path / "t.yaml", model={}, epochs=1, bootstrap=20)  # names no model: --preset
    args = ["train", "--task", str(task), "--features", str(cohort.bags), "--labels", str(cohort.labels),
            "--no-progress", "--preset"]  # fmt: skip
    ok = CliRunner().invoke(cli, [*args, "dsmil", "--out", str(tmp_path / "r")])
    assert ok.exit_code == 0, ok.output
    assert json.loads((tmp_path / "r" / "config.json").read_text())["model"]["kind"] == "dsmil"
    labels = tmp_path / "os.csv"
    patients = sorted(set(cohort.patient_of.values()))  # nsclc-os is patient-level: one label each
    index = {s: patients.index(cohort.patient_of[s]) for s in cohort.slides}
    rows = [f"{s},{10 + index[s]},{index[s] % 2}" for s in cohort.slides]
    labels.write_text("slide,OS_MONTHS,OS_STATUS\n" + "\n".join(rows) + "\n")
    survival = ["train", "--task", "nsclc-os", "--features", str(cohort.bags), "--labels", str(labels),
                "--out", str(tmp_path / "s")]  # fmt: skip
    refused = CliRunner().invoke(cli, [*survival, "--preset", "clam-sb"])
    assert refused.exit_code == 2
    assert (
        "clam-sb (clam_sb) trains categorical tasks only" in refused.output and "survival" in refused.output
    )


@pytest.mark.slow
def test_raw_slides_predict_like_their_bags(tmp_path: Path) -> None:
    """Bags made by tile + embed; each baseline trained on them predicts the raw slides (tile -> embed ->
    model) with the probabilities it gives their bags, and draws a heatmap over each slide."""
    from wsi.pipelines.embed.engine import EmbedOptions
    from wsi.pipelines.embed.stage import tile_and_embed
    from wsi.pipelines.train import train
    from wsi.slides.sources import find_slides
    from wsi.synthetic import write_sample_cohort
    from wsi.tiling.params import TileParams

    slides = write_sample_cohort(tmp_path / "slides", n=4, size_um=800, mpp=1.0, styles=("a", "b"))
    options = EmbedOptions(encoder="timm:resnet18", random_init=True, input_px=32, device="cpu", readers=0)
    params = TileParams(tile_um=96, tile_px=32, min_blur_variance=0)
    tile_and_embed(find_slides([tmp_path / "slides"]), out_dir=tmp_path / "emb", options=options,
                 tile_params=params, progress=False)  # fmt: skip
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "slide,label\n" + "".join(f"{s.path.stem},{CLASSES[i % 2]}\n" for i, s in enumerate(slides))
    )
    bags = tmp_path / "emb" / "features" / "timm-resnet18"
    for preset in PRESETS:
        run = tmp_path / preset
        train(task=_task(tmp_path / f"{preset}.yaml", preset, epochs=1), labels_csv=labels, features_dir=bags,
              out_dir=run, progress=False)  # fmt: skip
        from_slides = predict(model_dir=run, inputs=[slides[0].path], out_dir=tmp_path / f"{preset}-s",
                              progress=False)  # fmt: skip
        from_bags = predict(
            model_dir=run, features_dir=bags, out_dir=tmp_path / f"{preset}-b", progress=False
        )
        want = {r["slide"]: r for r in from_bags.rows}[slides[0].path.stem]
        (row,) = from_slides.rows
        for c in CLASSES:
            assert float(row[f"prob_{c}"]) == pytest.approx(float(want[f"prob_{c}"]), abs=1e-5), preset
        assert (tmp_path / f"{preset}-s" / "heatmaps" / f"{slides[0].path.stem}.png").read_bytes()[:8] == PNG

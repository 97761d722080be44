"""`wsi train --task nsclc-subtype --preset P` for every preset, `--recipe authors` for every baseline, and
what each records in the run (issue 43): the packaged task's own model settings reach only the presets
that take them, DSMIL trains one output scored by a sigmoid, CLAM-SB takes nsclc-subtype's subtyping
flag, and an option a preset cannot take is refused (exit 2) naming the option and the preset."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from cohorts import CLASSES, Cohort, make_cohort

from wsi.cli.main import cli
from wsi.formats.bags import read_bag
from wsi.pipelines.predict.stage import load_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BAG_PRESETS = ("vit-wsi", "vit-wsi-small", "abmil", "transmil", "clam-sb", "clam-mb", "dsmil", "dtfd",
               "linear", "mlp")  # fmt: skip
BASELINES = ("transmil", "clam-sb", "clam-mb", "dsmil", "dtfd")


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Cohort:
    torch.set_num_threads(1)
    return make_cohort(tmp_path_factory.mktemp("recipes") / "cohort", n_patients=10)


def _train(cohort: Cohort, out: Path, *extra: str) -> Any:
    args = ["train", "--task", "nsclc-subtype", "--features", str(cohort.bags), "--labels",
            str(cohort.labels), "--out", str(out), "--no-progress", *extra]  # fmt: skip
    return CliRunner().invoke(cli, args)


def _record(run: Path) -> dict[str, Any]:
    return json.loads((run / "config.json").read_text())


@pytest.mark.slow  # ten full-size models, one epoch each (~1-2 min on two cores)
def test_every_preset_trains_on_the_packaged_subtyping_task(cohort: Cohort, tmp_path: Path) -> None:
    for preset in BAG_PRESETS:
        result = _train(cohort, tmp_path / preset, "--preset", preset, "--epochs", "1")
        assert result.exit_code == 0, (preset, result.output)
        record = _record(tmp_path / preset)
        task = record["task"]
        assert task["model"]["preset"] == preset
        assert (task["model"]["attention"] == "seqnorm") == (preset in ("vit-wsi", "vit-wsi-small"))
        assert ("subtyping" in task["model"]["overrides"]) == preset.startswith("clam")
    assert _record(tmp_path / "clam-sb")["model"]["subtyping"] is True  # the out-of-class instance loss
    dsmil = _record(tmp_path / "dsmil")
    assert dsmil["model"]["num_classes"] == 1 and dsmil["task"]["model"]["scoring"] == "sigmoid"
    for preset in ("vit-2d", "vit-3d"):  # models of images: refused by name, not a traceback
        refused = _train(cohort, tmp_path / preset, "--preset", preset, "--epochs", "1")
        assert refused.exit_code == 2
        assert f"model {preset} reads images; task 'nsclc-subtype' gives bags" in refused.output


def test_dsmil_trains_one_output_scored_by_a_sigmoid(cohort: Cohort, tmp_path: Path) -> None:
    """Two classes: one output (the authors' --num_classes=1), its BCE, p(LUSC) = sigmoid(z) in
    test_predictions.csv, and predict's heatmaps from the one output's contributions."""
    run = tmp_path / "dsmil"
    result = _train(cohort, run, "--preset", "dsmil", "--epochs", "2")
    assert result.exit_code == 0, result.output
    loaded = load_run(run, device="cpu")
    (model,) = loaded.models
    assert model.instance_head.out_features == 1 and loaded.kind.num_outputs == 1
    with (run / "test_predictions.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows
    for row in rows:
        bag = read_bag(next(cohort.bags.glob(f"{row['slide']}*.h5")))
        with torch.no_grad():
            z = model(torch.from_numpy(bag.feats).float()[None])
        assert z.shape == (1, 1)
        assert float(row[f"prob_{CLASSES[1]}"]) == pytest.approx(float(torch.sigmoid(z)), abs=1e-5)
        assert float(row[f"prob_{CLASSES[0]}"]) == pytest.approx(1 - float(torch.sigmoid(z)), abs=1e-5)
    few = tmp_path / "few"
    few.mkdir()
    (few / f"{cohort.slides[0]}.h5").write_bytes((cohort.bags / f"{cohort.slides[0]}.h5").read_bytes())
    out = tmp_path / "pred"
    predicted = CliRunner().invoke(cli, ["predict", "--model", str(run), "--features", str(few), "--out",
                                         str(out), "--no-progress"])  # fmt: skip
    assert predicted.exit_code == 0, predicted.output
    values = json.loads((out / "heatmaps" / f"{cohort.slides[0]}.json").read_text())
    assert set(values["outputs"]) == set(CLASSES)


@pytest.mark.slow  # five baselines, two epochs each under their authors' recipes
def test_recipe_authors_runs_for_every_baseline_and_is_recorded(cohort: Cohort, tmp_path: Path) -> None:
    want = {"transmil": ("lookahead-radam", 2), "clam-sb": ("adam", 1), "clam-mb": ("adam", 1),
            "dsmil": ("adam", 1), "dtfd": ("adam", 1)}  # fmt: skip
    for preset in BASELINES:
        run = tmp_path / preset
        result = _train(cohort, run, "--preset", preset, "--recipe", "authors", "--epochs", "2")
        assert result.exit_code == 0, (preset, result.output)
        task = _record(run)["task"]
        assert task["recipe"] == "authors"
        assert (task["optimizer"]["name"], task["grad_accum"]) == want[preset]
        assert task["augment"]["tile_fraction"] == [1.0, 1.0] and task["epochs"] == 2  # --epochs still wins
    assert _record(tmp_path / "transmil")["model"]["nystrom_version"] == "0.0.9"
    clam = _record(tmp_path / "clam-sb")
    assert clam["task"]["sampling"] == "balanced" and clam["model"]["inst_loss"] == "svm"
    assert _record(tmp_path / "dsmil")["task"]["optimizer"]["betas"] == [0.5, 0.9]


def test_an_option_the_preset_cannot_take_is_refused_naming_option_and_preset(
    cohort: Cohort, tmp_path: Path
) -> None:
    refused = _train(cohort, tmp_path / "r", "--preset", "dsmil", "--attention", "gdla", "--epochs", "1")
    assert refused.exit_code == 2
    assert "--attention 'gdla': preset dsmil (model kind dsmil) cannot take it" in refused.output
    assert "configs/models/dsmil.yaml" not in refused.output
    refused = _train(cohort, tmp_path / "a", "--preset", "abmil", "--recipe", "authors")
    assert refused.exit_code == 2 and "preset abmil has no authors' recipe" in refused.output

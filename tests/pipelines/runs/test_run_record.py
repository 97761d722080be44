"""The run record (config.json): written once per run with the model once, read by predict without
the training code, and run folders written before it (format 1) still predict the same."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cohorts import make_cohort, write_task

from wsi.core.errors import ConfigError
from wsi.pipelines.predict.stage import predict
from wsi.pipelines.runs.record import FORMAT_VERSION, read_run_record
from wsi.pipelines.train import train

REPO = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parents[2] / "fixtures" / "run-v1"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory):
    # the same seeded cohort the format-1 fixtures were trained and predicted on
    return make_cohort(tmp_path_factory.mktemp("cohort"), n_patients=12)


def _probs(path: Path) -> dict[str, list[str]]:
    return {r["slide"]: [r["prob_LUAD"], r["prob_LUSC"], r["predicted"]] for r in csv.DictReader(path.open())}


@pytest.mark.parametrize("layout", ["single", "cv"])
def test_format_1_run_folders_predict_the_same(cohort, tmp_path: Path, layout: str) -> None:
    """Run folders written before the run record type (model_spec + model, fold-k/) still load, and
    predict the very probabilities the code that wrote them did: the same class, and each probability
    within one unit of the CSV's 6th decimal (float32 kernels differ by CPU, so a value on a rounding
    boundary may print one unit apart on another machine; seen on this project's machines)."""
    run = tmp_path / layout
    shutil.copytree(FIXTURES / layout, run)
    old = json.loads((run / "config.json").read_text())
    assert "model_spec" in old and "format_version" not in old  # really the old layout
    kw = {"features_dir": cohort.bags, "heatmaps": False, "progress": False}
    result = predict(model_dir=run, out_dir=tmp_path / "p", **kw)
    expected = _probs(run / "expected_predictions.csv")
    assert len(expected) == len(cohort.slides)
    got = _probs(result.predictions_csv)
    assert got.keys() == expected.keys()
    for slide, (luad, lusc, predicted) in expected.items():
        assert got[slide][2] == predicted, slide
        assert abs(float(got[slide][0]) - float(luad)) <= 1.01e-6, slide
        assert abs(float(got[slide][1]) - float(lusc)) <= 1.01e-6, slide
    record = read_run_record(run)
    assert record.format_version == FORMAT_VERSION and record.model == old["model"]
    assert record.cv == (2 if layout == "cv" else None)


@pytest.mark.parametrize("layout", ["single", "cv/fold-1"])
def test_a_format_1_record_saying_optimizer_scheduler_reads_as_schedule(layout: str) -> None:
    saved = json.loads((FIXTURES / layout / "config.json").read_text())
    assert saved["task"]["optimizer"]["scheduler"] == "cosine"  # the fixture as an earlier version wrote it
    assert read_run_record(FIXTURES / layout).task.optimizer.schedule == "cosine"


def test_a_new_run_records_the_model_once(cohort, tmp_path: Path) -> None:
    small = {"dim": 16, "attn_dim": 16, "depth": 1, "heads": 2, "mlp_dim": 16}
    model = {"preset": "vit-wsi", "attention": "sima", "overrides": small}
    task = write_task(tmp_path / "task.yaml", epochs=1, model=model)
    out = tmp_path / "cv"
    train(task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=out, cv=2, progress=False)
    top = json.loads((tmp_path / "cv" / "config.json").read_text())
    assert "model_spec" not in top and top["format_version"] == FORMAT_VERSION
    assert top["model"]["kind"] == "mil" and top["model"]["attention"] == "sima" and top["model"]["dim"] == 16
    assert top["cv"] == 2 and len(top["splits"]) == 2 and top["fold"] is None
    for k in (1, 2):
        fold = json.loads((tmp_path / "cv" / f"fold-{k}" / "config.json").read_text())
        assert fold["fold"] == k and fold["splits"] == [top["splits"][k - 1]]
        assert fold["model"] == top["model"] and fold["task"] == top["task"]


def test_unreadable_or_newer_records_are_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "single", run)
    data = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**data, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(ConfigError, match="newer than this wsi reads"):
        read_run_record(run)
    (run / "config.json").write_text(json.dumps({k: v for k, v in data.items() if k != "model"}))
    with pytest.raises(ConfigError, match="no model architecture"):
        read_run_record(run)
    (run / "config.json").write_text(json.dumps({**data, "classes": "LUAD"}))
    with pytest.raises(ConfigError, match=r"config\.json.*classes"):
        read_run_record(run)
    (run / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable run record"):
        read_run_record(run)


def test_predict_does_not_import_the_training_code() -> None:
    code = (
        "import sys, wsi.pipelines.predict.stage; "
        "print(sorted(m for m in sys.modules "
        "if m == 'wsi.pipelines.train' or m.startswith('wsi.pipelines.train.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

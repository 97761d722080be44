"""Model folders whose parts disagree (issue 31): config.json edited to another feature width or class
list, weights copied in from another run or another size, `--init-from` a run of another task kind. Each
is refused before use with a message naming the file and what disagrees (exit 2), never a torch
`size mismatch` traceback or an empty `prob_C` column."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from cohorts import TINY, make_cohort, write_task

from wsi.cli.main import cli
from wsi.core.errors import WeightsError
from wsi.models.presets import build_model_from_config
from wsi.pipelines.runs.checkpoints import load_into, save_weights, weights_metadata
from wsi.pipelines.runs.record import RUN_STAMP_KEY, read_run_record
from wsi.pipelines.train import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hostile-models")
    cohort = make_cohort(root, n_patients=6)
    result = train(
        task=write_task(root / "task.yaml", epochs=1), labels_csv=cohort.labels, features_dir=cohort.bags,
        out_dir=root / "run", progress=False,
    )  # fmt: skip
    return cohort, result.run_dir


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def _edit_record(run: Path, change: Any) -> None:
    path = run / "config.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def _predict(run: Path, cohort: Any, out: Path) -> Any:
    return CliRunner().invoke(
        cli,
        ["predict", "--model", str(run), "--features", str(cohort.bags), "--out", str(out), "--no-progress"],
    )


def _refused(result: Any, *needles: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output and "size mismatch" not in result.output
    for needle in needles:
        assert needle in result.output, result.output
    return str(result.output)


def test_best_weights_name_the_run_they_belong_to(trained: tuple[Any, Path]) -> None:
    _, run = trained
    assert weights_metadata(run / "best.safetensors")[RUN_STAMP_KEY] == read_run_record(run).created


def test_a_record_edited_to_another_feature_width(trained: tuple[Any, Path], tmp_path: Path) -> None:
    cohort, run = trained
    run = _copy(run, tmp_path)
    _edit_record(run, lambda d: d["model"].update(in_dim=768))
    out = _refused(_predict(run, cohort, tmp_path / "out"), "best.safetensors", "proj.weight", "in_dim")
    assert "768" in out and "16" in out


def test_a_record_edited_to_another_class_list(trained: tuple[Any, Path], tmp_path: Path) -> None:
    cohort, run = trained
    run = _copy(run, tmp_path)

    def three_classes(d: dict[str, Any]) -> None:
        d["classes"] = d["task"]["classes"] = ["LUAD", "LUSC", "C"]

    _edit_record(run, three_classes)
    _refused(_predict(run, cohort, tmp_path / "out"), "config.json", "2 outputs", "need 3")
    assert not (tmp_path / "out" / "predictions.csv").exists()  # no empty prob_C column


def test_a_record_whose_classes_disagree_with_its_task(trained: tuple[Any, Path], tmp_path: Path) -> None:
    cohort, run = trained
    run = _copy(run, tmp_path)
    _edit_record(run, lambda d: d.update(classes=["LUSC", "LUAD"]))
    _refused(_predict(run, cohort, tmp_path / "out"), "config.json", "['LUSC', 'LUAD']", "differ")


def test_weights_from_another_run(trained: tuple[Any, Path], tmp_path: Path) -> None:
    """Same architecture, so every shape fits: only the run stamp tells them apart."""
    cohort, run = trained
    run = _copy(run, tmp_path)
    _edit_record(run, lambda d: d.update(created="2020-01-01T00:00:00+00:00"))  # as if another run's
    _refused(_predict(run, cohort, tmp_path / "out"), "best.safetensors", "was trained by the run started")


def test_weights_of_another_size(trained: tuple[Any, Path], tmp_path: Path) -> None:
    cohort, run = trained
    run = _copy(run, tmp_path)
    record = read_run_record(run)
    bigger = build_model_from_config({**record.model, "dim": 64}, source="test", saved=True)
    save_weights(bigger, run / "best.safetensors")  # no stamp: a file from before stamps, or elsewhere
    out = _refused(_predict(run, cohort, tmp_path / "out"), "best.safetensors", "in the weights but")
    assert "64" in out and "32" in out and "different runs" in out


def _init_from(trained: tuple[Any, Path], tmp_path: Path, source: Path, **task: Any) -> Any:
    cohort, _ = trained
    args = ["train", "--task", str(write_task(tmp_path / "t.yaml", epochs=1, **task)), "--labels",
            str(cohort.labels), "--features", str(cohort.bags), "--out", str(tmp_path / "new"),
            "--init-from", str(source), "--no-progress"]  # fmt: skip
    return CliRunner().invoke(cli, args)


def test_init_from_a_run_of_another_kind(trained: tuple[Any, Path], tmp_path: Path) -> None:
    _, run = trained
    source = _copy(run, tmp_path)

    def regression(d: dict[str, Any]) -> None:
        d["classes"] = d["task"]["classes"] = []
        d["task"].update(kind="regression", targets=[{"column": "purity"}])

    _edit_record(source, regression)
    _refused(
        _init_from(trained, tmp_path, source), "--init-from", "regression task", "this one is categorical"
    )


def test_init_from_a_run_of_other_classes(trained: tuple[Any, Path], tmp_path: Path) -> None:
    _, run = trained
    result = _init_from(trained, tmp_path, run, classes=["LUSC", "LUAD"])
    _refused(result, "--init-from", "['LUAD', 'LUSC']", "would be read as other classes")


def test_init_from_weights_of_another_size(trained: tuple[Any, Path], tmp_path: Path) -> None:
    """A bare .safetensors (no record beside it) of another width: the tensors and shapes are named."""
    _, run = trained
    record = read_run_record(run)
    wide = build_model_from_config({**record.model, "dim": 64}, source="test", saved=True)
    weights = tmp_path / "wide" / "w.safetensors"
    weights.parent.mkdir()
    save_weights(wide, weights)
    result = _init_from(trained, tmp_path, weights, model={"preset": "vit-wsi", "attention": "seqnorm",
                                                           "overrides": dict(TINY)})  # fmt: skip
    _refused(result, "w.safetensors", "(1, 1, 64) in the source but (1, 1, 32)", "of this model's size")
    with pytest.raises(WeightsError, match="does not fit the model"):
        load_into(build_model_from_config(record.model, source="test", saved=True), weights)

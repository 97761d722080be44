"""Nothing lost: a second `wsi predict` into one folder merges by slide (other --features) or refuses
another model without --overwrite; the manifest and predictions.csv always agree; a failed `wsi train`
start blocks neither the next run nor --resume."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from cohorts import make_cohort, write_task

from wsi.cli.main import cli
from wsi.core.errors import ConfigError
from wsi.pipelines.predict.stage import predict
from wsi.pipelines.scheduling.jobs import read_manifest
from wsi.pipelines.train import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    """A cohort and two trained runs of it (different seeds: different models)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("kept")
    cohort = make_cohort(root, n_patients=8)
    task = write_task(root / "task.yaml", epochs=2)
    made = [
        train(task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=root / f"run{s}",
              progress=False, seed=s).run_dir
        for s in (0, 1)
    ]  # fmt: skip
    return cohort, made


def _split_bags(cohort, root: Path) -> tuple[Path, Path]:
    first, second = root / "a", root / "b"
    for folder, slides in ((first, cohort.slides[:4]), (second, cohort.slides[4:])):
        folder.mkdir()
        for slide in slides:
            shutil.copy(cohort.bags / f"{slide}.h5", folder / f"{slide}.h5")
    return first, second


def _rows(path: Path) -> dict[str, dict[str, str]]:
    return {r["slide"]: r for r in csv.DictReader(path.open())}


def _agree(out: Path) -> set[str]:
    """predictions.csv holds exactly the slides the manifest lists as predicted."""
    done = {r.slide_id for r in read_manifest(out / "manifest.csv") if r.status in ("ok", "skipped")}
    assert set(_rows(out / "predictions.csv")) == done
    return done


def test_other_features_into_one_folder_are_merged_by_slide(runs, tmp_path: Path) -> None:
    cohort, (run, _) = runs
    first, second = _split_bags(cohort, tmp_path)
    out = tmp_path / "out"
    one = _rows(
        predict(
            model_dir=run, features_dir=first, out_dir=out, progress=False, heatmaps=False
        ).predictions_csv
    )
    predict(model_dir=run, features_dir=second, out_dir=out, progress=False, heatmaps=False)
    assert _agree(out) == set(cohort.slides)  # the first call's rows are still there
    merged = _rows(out / "predictions.csv")
    assert all(merged[s] == one[s] for s in one)  # unchanged, not recomputed
    # the same slide again from another bag file: its row is replaced, not doubled
    again = tmp_path / "again"
    again.mkdir()
    shutil.copy(cohort.bags / f"{cohort.slides[5]}.h5", again / f"{cohort.slides[0]}.h5")
    predict(model_dir=run, features_dir=again, out_dir=out, progress=False, heatmaps=False)
    assert _agree(out) == set(cohort.slides)
    after = _rows(out / "predictions.csv")
    assert after[cohort.slides[0]]["prob_LUAD"] == merged[cohort.slides[5]]["prob_LUAD"]


def test_another_model_is_refused_without_overwrite(runs, tmp_path: Path) -> None:
    cohort, (run, other) = runs
    out = tmp_path / "out"
    predict(model_dir=run, features_dir=cohort.bags, out_dir=out, progress=False, heatmaps=False)
    before = (out / "predictions.csv").read_text()
    with pytest.raises(ConfigError, match="another model") as err:
        predict(model_dir=other, features_dir=cohort.bags, out_dir=out, progress=False, heatmaps=False)
    assert str(run) in str(err.value) and "--overwrite" in str(err.value)
    assert (out / "predictions.csv").read_text() == before  # nothing replaced
    res = CliRunner().invoke(
        cli,
        [
            "predict",
            "--model",
            str(other),
            "--features",
            str(cohort.bags),
            "--out",
            str(out),
            "--no-progress",
            "--no-heatmaps",
        ],
    )
    assert res.exit_code == 2 and "another model" in res.output and "Traceback" not in res.output
    # --overwrite replaces them, and the manifest forgets the old rows with them
    first, _ = _split_bags(cohort, tmp_path)
    predict(model_dir=other, features_dir=first, out_dir=out, progress=False, overwrite=True, heatmaps=False)
    assert _agree(out) == set(cohort.slides[:4])


def test_a_predictions_csv_without_record_is_not_replaced(runs, tmp_path: Path) -> None:
    cohort, (run, _) = runs
    out = tmp_path / "out"
    out.mkdir()
    (out / "predictions.csv").write_text("slide,prob_LUAD\nmine,0.5\n")
    with pytest.raises(ConfigError, match="does not say how it was made"):
        predict(model_dir=run, features_dir=cohort.bags, out_dir=out, progress=False, heatmaps=False)
    assert "mine" in (out / "predictions.csv").read_text()


def test_a_failed_train_start_blocks_neither_rerun_nor_resume(
    runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cohort, _ = runs
    task = write_task(tmp_path / "task.yaml", epochs=1)
    import wsi.pipelines.train.run as run_module

    def broken(spec):  # the first epoch never finishes (a full disk, a crash, Ctrl-C)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_module, "run_fold", broken)
    out = tmp_path / "run"
    with pytest.raises(OSError):
        train(task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=out, progress=False)
    assert (out / "config.json").is_file() and not (out / ".wsi-lock").exists()
    monkeypatch.undo()
    for resume in (True, False):  # --resume, then a plain re-run over its (finished) result
        if not resume:
            shutil.rmtree(out / "resume", ignore_errors=True)
            for name in ("best.safetensors", "last.safetensors", "metrics.json"):
                (out / name).unlink(missing_ok=True)
        result = train(
            task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=out, progress=False,
            resume=resume,
        )  # fmt: skip
        assert result.best_checkpoint is not None and result.best_checkpoint.is_file()

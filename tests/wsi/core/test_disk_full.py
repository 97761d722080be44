"""A full disk is a message ("no space left on <folder> ..., needs about N MB"), per slide where the batch
can go on, never a traceback, and leaves no temporary file or folder behind; after space is freed the
same command finishes (nothing left from the failed run blocks it). Each output folder is a 2 MB tmpfs
filled to a few KB; skipped where mounting is not allowed (not root, no CAP_SYS_ADMIN)."""

from __future__ import annotations

import csv
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from cohorts import make_cohort, write_task

from wsi.cli.main import cli
from wsi.core.files import is_temp_name
from wsi.pipelines.train import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ENCODER = "timm:test_resnet"


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """`full_disk(free_kb)`: a fresh 2 MB tmpfs with only about `free_kb` KB left; unmounted afterwards."""
    mounted: list[Path] = []

    def make(free_kb: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'}): needs root")
        mounted.append(where)
        (where / "filler").write_bytes(b"\0" * (2048 - free_kb) * 1024)
        return where

    yield make
    for where in mounted:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _free(disk: Path) -> None:
    (disk / "filler").unlink()


def _no_temps(folder: Path) -> None:
    left = [p for p in folder.rglob("*") if is_temp_name(p)]
    assert not left, left


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _clean(result: Result) -> None:
    """No traceback: the command ended with its own exit code and message."""
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)


@pytest.fixture(scope="module")
def cohort_run(tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("full")
    cohort = make_cohort(root, n_patients=6)
    task = write_task(root / "task.yaml", epochs=1)
    run = train(
        task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=root / "run", progress=False
    )
    return cohort, task, run.run_dir


def test_tile_full_disk_is_a_per_slide_message(make_slide, full_disk) -> None:
    slide = make_slide(name="full", size_um=1024.0, mpp=0.5, seed=5)
    disk = full_disk(12)
    out = disk / "out"
    result = CliRunner().invoke(cli, ["tile", str(slide.path), "--out", str(out), "--tile-um", "128"])
    _clean(result)
    assert result.exit_code in (1, 2), result.output
    assert "no space left on" in result.output
    if result.exit_code == 1:  # the slide failed alone; the manifest says why
        (row,) = _rows(out / "tiles" / "manifest.csv")
        assert row["status"] == "failed" and row["error"].startswith("no space left on")
    _no_temps(disk)
    _free(disk)
    again = CliRunner().invoke(cli, ["tile", str(slide.path), "--out", str(out), "--tile-um", "128"])
    assert again.exit_code == 0, again.output


def test_embed_full_disk_is_a_per_slide_message(make_slide, full_disk, tmp_path: Path) -> None:
    slide = make_slide(name="fullemb", size_um=800.0, mpp=1.0, seed=6)
    tiles = tmp_path / "tiles"
    args = ["tile", str(slide.path), "--out", str(tiles), "--tile-um", "128", "--tile-px", "32"]
    assert CliRunner().invoke(cli, args).exit_code == 0
    disk = full_disk(16)
    embed = ["embed", "--tiles", str(tiles), "--out", str(disk / "out"), "--encoder", ENCODER,
             "--random-init", "--input-px", "64", "--readers", "0", "--dtype", "float32"]  # fmt: skip
    result = CliRunner().invoke(cli, embed)
    _clean(result)
    assert result.exit_code == 1, result.output
    (row,) = _rows(disk / "out" / "features" / "timm-test_resnet" / "manifest.csv")
    assert (
        row["status"] == "failed"
        and row["error"].startswith("no space left on")
        and "needs about" in row["error"]
    )
    _no_temps(disk)
    _free(disk)
    assert CliRunner().invoke(cli, embed).exit_code == 0


def test_train_full_disk_then_rerun(cohort_run, full_disk) -> None:
    cohort, task, _ = cohort_run
    disk = full_disk(24)
    args = ["train", "--task", str(task), "--labels", str(cohort.labels), "--features", str(cohort.bags),
            "--out", str(disk / "run"), "--no-progress"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    _clean(result)
    assert result.exit_code == 2, result.output
    assert "no space left on" in result.output
    _no_temps(disk)
    _free(disk)
    for extra in ([], ["--resume"]):  # neither a re-run nor --resume is blocked by the failed start
        again = CliRunner().invoke(cli, [*args, *extra])
        assert again.exit_code == 0, again.output
        if not extra:
            for name in ("best.safetensors", "last.safetensors", "metrics.json"):
                (disk / "run" / name).unlink()
            import shutil

            shutil.rmtree(disk / "run" / "resume")


def test_predict_full_disk_then_rerun(cohort_run, full_disk) -> None:
    cohort, _, run = cohort_run
    disk = full_disk(12)
    args = [
        "predict",
        "--model",
        str(run),
        "--features",
        str(cohort.bags),
        "--out",
        str(disk / "out"),
        "--no-progress",
    ]
    result = CliRunner().invoke(cli, args)
    _clean(result)
    assert result.exit_code in (1, 2), result.output
    assert "no space left on" in result.output
    _no_temps(disk)
    _free(disk)
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0, again.output
    assert len(_rows(disk / "out" / "predictions.csv")) == len(cohort.slides)

"""Image tasks end to end: `wsi train` / `wsi predict` on tiny sets built from the real images, the
image input adapter, heatmaps, and corrupt files being skipped by path."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from PIL import Image

from wsi.cli.main import cli
from wsi.core.config import config_dict
from wsi.core.errors import ConfigError, ImageReadError
from wsi.pipelines.inputs import Item, build_input
from wsi.pipelines.inputs.clinical.dataset import ImageDataset, collate_images
from wsi.pipelines.inputs.clinical.heatmap import project, save_heatmap
from wsi.pipelines.inputs.clinical.readers import read_image
from wsi.pipelines.inputs.clinical.transforms import ImageSpec
from wsi.pipelines.inputs.images import ImageInput, image_id, infer_grid
from wsi.pipelines.study.tasks import load_task

nib = pytest.importorskip("nibabel")

TINY_MODEL = {"dim": 32, "attn_dim": 32, "depth": 1, "heads": 2, "mlp_dim": 32}
IMAGE_TASKS = [
    "isic-melanoma",
    "cxr-cardiomegaly",
    "cxr-cardiomegaly-1024",
    "airogs-glaucoma",
    "duke-breast-mri",
]


def _tiny_task(tmp_path: Path, name: str, input_options: dict) -> Path:
    """The packaged task with a tiny model, small inputs and a short bootstrap, as a user's YAML."""
    data = config_dict(load_task(name))
    data["model"]["overrides"] = TINY_MODEL
    data["input_options"].update(input_options)
    data.update(bootstrap=20, num_workers=0, batch_size=4)
    path = tmp_path / f"{name}-tiny.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _write_labels(path: Path, header: tuple[str, str, str], rows: list[tuple[str, str, str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _invoke(args: list[str]) -> str:
    """Run `wsi ARGS`; returns stdout and stderr (where the CLI logs)."""
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture()
def derm_set(shared_data: Path, tmp_path: Path) -> tuple[Path, Path]:
    """12 crops of the five real dermoscopy images (two classes) plus a garbage and a truncated JPEG."""
    folder = tmp_path / "derm"
    (folder / "sub").mkdir(parents=True)
    sources = sorted((shared_data / "derm").glob("ISIC_*.jpg"))
    rows = []
    for i in range(12):
        with Image.open(sources[i % len(sources)]) as img:
            crop = img.crop((i * 12, i * 6, i * 12 + 420, i * 6 + 320))
            # class 1 images get brighter: something a 2-epoch model can pick up at all
            crop = crop.point(lambda v: min(255, int(v * 1.3))) if i % 2 else crop
            crop.save(folder / ("sub" if i > 8 else "") / f"lesion{i:02d}.jpg", quality=90)
        rows.append((f"lesion{i:02d}.jpg", "malignant" if i % 2 else "benign", f"P{i // 2}"))
    (folder / "broken.jpg").write_bytes(b"this is not a JPEG" * 50)
    data = sources[0].read_bytes()
    (folder / "cut.jpg").write_bytes(data[: len(data) // 2])
    rows += [("broken.jpg", "benign", "PX"), ("cut.jpg", "malignant", "PY")]
    labels = _write_labels(tmp_path / "derm.csv", ("image_name", "benign_malignant", "patient_id"), rows)
    return folder, labels


def test_2d_task_trains_predicts_and_skips_corrupt_images(
    derm_set: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, labels = derm_set
    task = _tiny_task(tmp_path, "isic-melanoma", {"size_px": 64})
    run = tmp_path / "run"
    out = _invoke(
        ["train", "--task", str(task), "--images", str(folder), "--labels", str(labels), "--out", str(run),
         "--epochs", "2", "--device", "cpu", "--no-progress"]
    )  # fmt: skip
    assert "AUROC" in out
    # the two corrupt files are reported by path and left out; the run goes on with the other 12
    assert str(folder / "broken.jpg") in out and str(folder / "cut.jpg") in out  # the CLI logs to stderr
    config = json.loads((run / "config.json").read_text())
    assert config["counts"]["slides"] == 12 and config["input"]["name"] == "images"
    assert config["input"]["provenance"]["size_px"] == [64, 64]
    assert config["model"]["in_channels"] == 3 and config["model"]["kind"] == "vit2d"
    log_rows = list(csv.DictReader((run / "log.csv").open()))
    assert [r["epoch"] for r in log_rows] == ["1", "2"] and all(
        np.isfinite(float(r["train_loss"])) for r in log_rows
    )
    assert (run / "best.safetensors").is_file() and (run / "metrics.json").is_file()
    test_rows = list(csv.DictReader((run / "test_predictions.csv").open()))
    assert test_rows and all(
        abs(float(r["prob_benign"]) + float(r["prob_malignant"]) - 1) < 1e-5 for r in test_rows
    )

    # prediction: a folder (the corrupt files are skipped again) and one file named directly
    preds = tmp_path / "preds"
    said = _invoke(
        ["predict", "--model", str(run), str(folder / "sub"), str(folder / "lesion00.jpg"),
         "--out", str(preds), "--device", "cpu", "--no-progress"]
    )  # fmt: skip
    assert "4 image(s) predicted, 0 failed" in said  # images, not slides
    rows = list(csv.DictReader((preds / "predictions.csv").open()))
    assert sorted(r["slide"] for r in rows) == ["lesion00", "lesion09", "lesion10", "lesion11"]
    for r in rows:
        png = preds / "heatmaps" / f"{r['slide']}.png"
        with Image.open(png) as img:
            assert img.format == "PNG" and img.size == (2 * 420, 320 + 16)  # original | overlay, title


def test_3d_task_trains_and_predicts_on_volumes(shared_data: Path, tmp_path: Path) -> None:
    """Ten NIfTI volumes cut from the real 4D MRI (and one as .npy): duke-breast-mri, 2-fold CV."""
    src = nib.load(shared_data / "mri" / "example4d.nii.gz")
    data = np.asarray(src.dataobj, dtype=np.float32)  # (128, 96, 24, 2)
    folder = tmp_path / "mri"
    folder.mkdir()
    rows = []
    for i in range(10):
        vol = data[i * 4 : i * 4 + 80, :, :, i % 2]  # (80, 96, 24): shifted windows, both time points
        vol = vol * (1.0 + 0.5 * (i % 2)) + (i % 2) * 100.0  # class 1: brighter
        nib.save(nib.Nifti1Image(vol, src.affine), folder / f"case{i}.nii.gz")
        rows.append((f"case{i}", "positive" if i % 2 else "negative", f"P{i}"))
    np.save(folder / "extra.npy", np.asarray(data[:80, :, :, 0].T, dtype=np.float32))  # (D, H, W) layout
    rows.append(("extra.npy", "negative", "P10"))
    labels = _write_labels(tmp_path / "mri.csv", ("image", "label", "patient"), rows)
    task = _tiny_task(tmp_path, "duke-breast-mri", {"size_px": [8, 32, 32], "spacing_mm": [4.4, 4.0, 4.0]})
    run = tmp_path / "run3d"
    _invoke(
        ["train", "--task", str(task), "--images", str(folder), "--labels", str(labels), "--out", str(run),
         "--epochs", "2", "--device", "cpu", "--no-progress", "--cv", "2"]
    )  # fmt: skip
    config = json.loads((run / "config.json").read_text())
    assert config["counts"]["slides"] == 11 and config["model"]["kind"] == "vit3d"
    assert config["input"]["provenance"]["formats"] == {".nii.gz": 10, ".npy": 1}
    for fold in ("fold-1", "fold-2"):  # the slide code's cross-validation, one run folder per fold
        assert len(list(csv.DictReader((run / fold / "log.csv").open()))) == 2
        assert (run / fold / "best.safetensors").is_file()
    assert json.loads((run / "metrics.json").read_text())["folds"] == 2

    preds = tmp_path / "preds3d"
    _invoke(
        ["predict", "--model", str(run), str(folder), "--out", str(preds), "--device", "cpu", "--no-progress"]
    )
    rows = list(csv.DictReader((preds / "predictions.csv").open()))
    assert len(rows) == 11 and {r["predicted"] for r in rows} <= {"negative", "positive"}
    with Image.open(preds / "heatmaps" / "case3.png") as img:
        assert img.size == (2 * 256, 256 + 16)  # middle slice of 32x32, enlarged 8x: image | overlay


def test_predict_refuses_volumes_for_a_2d_model(shared_data: Path) -> None:
    adapter = ImageInput(size_px=64, channels=1, normalize="range")
    prov = adapter.provenance([])
    item = Item(id="v", path=shared_data / "mri" / "example4d.nii.gz")
    with pytest.raises(ConfigError, match="2D images"):
        adapter.check_compatible(prov, [item])
    with pytest.raises(ConfigError, match="size_px"):
        ImageInput(size_px=128, channels=1, normalize="range").check_compatible(prov, [])
    volumes = ImageInput(size_px=[8, 32, 32], channels=1)
    with pytest.raises(ConfigError, match="2D pictures"):
        volumes.check_compatible(
            volumes.provenance([]), [Item(id="c", path=shared_data / "cxr" / "00000001_000.png")]
        )
    with pytest.raises(ImageReadError, match="takes volumes"):  # a lone slice is no volume either
        read_image(shared_data / "mri" / "MR_small.dcm", spatial_dims=3)


@pytest.mark.parametrize("name", IMAGE_TASKS)
def test_packaged_image_tasks_match_the_paper(name: str) -> None:
    task = load_task(name)
    adapter = build_input(task.input, task.input_options)
    assert isinstance(adapter, ImageInput)
    expected = {
        "isic-melanoma": ((224, 224), 3, 32, "vit-2d"),
        "cxr-cardiomegaly": ((224, 224), 1, 32, "vit-2d"),
        "cxr-cardiomegaly-1024": ((1024, 1024), 1, 4, "vit-2d"),
        "airogs-glaucoma": ((224, 224), 3, 32, "vit-2d"),
        "duke-breast-mri": ((32, 256, 256), 1, 16, "vit-3d"),
    }[name]
    assert (adapter.spec.size_px, adapter.spec.channels, task.batch_size, task.model.preset) == expected
    from wsi.models import build_model

    model = build_model(task.model.preset, **adapter.model_kwargs([]), **TINY_MODEL)
    grid = model.grid_shape(adapter.spec.size_px)  # the paper's token counts: 196, 4,096, 8x16x16
    assert int(np.prod(grid)) == {224: 196, 1024: 4096, 256: 2048}[adapter.spec.size_px[-1]]


def test_unknown_input_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="input_options"):
        build_input("images", {"size": 224})
    with pytest.raises(ConfigError, match="normalize"):
        build_input("images", {"normalize": "minmax"})
    with pytest.raises(ConfigError, match="size_px"):
        build_input("images", {"size_px": "224"})
    with pytest.raises(ConfigError, match="channels"):
        build_input("images", {"channels": 2})


def test_find_ids_and_duplicates(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    np.save(tmp_path / "a" / "x1.npy", np.zeros((4, 4), np.float32))
    Image.new("L", (8, 8)).save(tmp_path / "b" / "x2.png")
    Image.new("L", (8, 8)).save(tmp_path / "b" / ".hidden.png")
    nib.save(nib.Nifti1Image(np.zeros((2, 2, 2), np.float32), np.eye(4)), tmp_path / "a" / "v.nii.gz")
    found = ImageInput().find([tmp_path])
    assert found == {
        "x1": tmp_path / "a" / "x1.npy",
        "x2": tmp_path / "b" / "x2.png",
        "v": tmp_path / "a" / "v.nii.gz",
    }
    assert image_id(Path("scan.nii.gz")) == "scan"
    Image.new("L", (8, 8)).save(tmp_path / "a" / "x2.jpg")
    with pytest.raises(ConfigError, match="x2"):
        ImageInput().find([tmp_path])


def test_unreadable_image_at_read_time_is_dropped_from_its_batch(
    shared_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gone = tmp_path / "gone.png"
    Image.new("L", (8, 8)).save(gone)
    rows = [
        (shared_data / "cxr" / "00000001_000.png", 0, "a"),
        (gone, 1, "gone"),
        (shared_data / "cxr" / "00027426_000.png", 1, "b"),
    ]
    ds = ImageDataset(rows, ImageSpec((32, 32), channels=1, normalize="range"))
    gone.unlink()  # disappears (or is damaged) after the files were found
    caplog.set_level(logging.ERROR)
    x, labels, ids = collate_images([ds[i] for i in range(3)])
    assert x.shape == (2, 1, 32, 32) and ids == ["a", "b"] and labels.tolist() == [0, 1]
    assert str(gone) in caplog.text and str(gone) in ds.skipped
    with pytest.raises(ImageReadError, match=r"gone\.png"):  # nothing readable: predict's per-image failure
        collate_images([ds[1]])


def test_training_augmentation_is_seeded_and_eval_is_not_augmented(shared_data: Path) -> None:
    rows = [(shared_data / "derm" / "ISIC_0024311.jpg", 0, "a")]
    spec = ImageSpec((32, 32), channels=3)
    plain = ImageDataset(rows, spec)[0]["x"]
    assert torch.equal(plain, ImageDataset(rows, spec)[0]["x"])
    aug = ImageDataset(rows, spec, augment=True, seed=5)
    first = aug[0]["x"]
    assert torch.equal(first, ImageDataset(rows, spec, augment=True, seed=5)[0]["x"])
    aug.set_epoch(1)
    assert not torch.equal(first, aug[0]["x"]) and not torch.equal(first, plain)


# --- heatmaps -------------------------------------------------------------------------------------


def test_heatmap_colours_positive_red_and_negative_blue(tmp_path: Path) -> None:
    image = np.tile(np.linspace(0.0, 1.0, 32, dtype=np.float32), (32, 1))[..., None]  # (32, 32, 1) ramp
    values = np.zeros(4, np.float32)
    values[1], values[2] = 2.0, -2.0  # grid (2, 2): top-right positive, bottom-left negative
    out = save_heatmap(image, values, (2, 2), tmp_path / "h.png", min_px=0)
    rgb = np.asarray(Image.open(out).convert("RGB"), dtype=int)
    assert rgb.shape == (32, 64, 3)
    overlay = rgb[:, 32:]
    top_right, bottom_left, top_left = overlay[8, 24], overlay[24, 8], overlay[8, 8]
    assert top_right[0] > top_right[2] + 30 and bottom_left[2] > bottom_left[0] + 30
    assert np.array_equal(top_left, rgb[8, 8])  # zero contribution: image unchanged
    with pytest.raises(ValueError, match="patch grid"):
        save_heatmap(image, values, (3, 3), tmp_path / "bad.png")


def test_3d_projections_pick_slice_and_strongest_patch() -> None:
    vol = np.zeros((8, 4, 4, 1), np.float32)
    vol[2, 1, 1] = 9.0
    grid = np.zeros((2, 2, 2), np.float32)
    grid[0, 0, 0], grid[1, 0, 0] = 1.0, -3.0
    mid_img, mid_grid = project(vol, grid, "mid")
    assert mid_img.shape == (4, 4, 1) and mid_grid.tolist() == grid[1].tolist()  # slice 4 -> patch row 1
    mip_img, mip_grid = project(vol, grid, "max")
    assert mip_img[1, 1, 0] == 9.0 and mip_grid[0, 0] == -3.0


def test_infer_grid_prefers_the_preset_patches() -> None:
    assert infer_grid((224, 224), 196) == (14, 14)
    assert infer_grid((32, 256, 256), 2048) == (8, 16, 16)  # (4, 16, 16) patches, not (16, 8, 8)
    assert infer_grid((8, 32, 32), 8) == (2, 2, 2)
    with pytest.raises(ValueError):
        infer_grid((30, 30), 7)


def test_3d_find_groups_dicom_series_folders(shared_data: Path, tmp_path: Path) -> None:
    import shutil

    for case in ("1.3.6.1.9", "case2"):
        (tmp_path / case).mkdir()
        for k in range(3):
            shutil.copy(shared_data / "mri" / "MR_small.dcm", tmp_path / case / f"{k}.dcm")
    shutil.copy(shared_data / "mri" / "MR_small.dcm", tmp_path / "single.dcm")
    found = ImageInput(size_px=[4, 32, 32], channels=1).find([tmp_path])
    assert found == {
        "1.3.6.1.9": tmp_path / "1.3.6.1.9",
        "case2": tmp_path / "case2",
        "single": tmp_path / "single.dcm",
    }
    with pytest.raises(ConfigError, match="two images with id '0'"):  # 2D: every file is an image
        ImageInput(size_px=32, channels=1).find([tmp_path])


def test_input_kinds_come_from_the_registry() -> None:
    from wsi.pipelines.inputs import INPUTS, list_inputs
    from wsi.pipelines.inputs.bags import BagInput

    assert list_inputs() == ["bags", "images", "slide-embeddings"]
    assert INPUTS.get("bags") is BagInput and INPUTS.get("images") is ImageInput
    with pytest.raises(ConfigError, match=r"unknown input 'tiles'.*bags, images"):
        build_input("tiles")

"""`wsi predict` never loses work or writes a guess (issue 10): results written as slides finish and a
re-run skips them; a NaN output fails its slide; options that cannot apply are refused; a raw slide that
kept no tile is in the manifest as `empty`; heatmaps of bags draw over the slide when it is reachable."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from cohorts import IN_DIM, make_cohort, write_task

import wsi.pipelines.predict.stage as predict_module
from wsi.cli.main import cli
from wsi.core.errors import ConfigError
from wsi.formats.bags import BagProvenance, bag_length, write_bag
from wsi.pipelines.predict.progress import PROGRESS_NAME
from wsi.pipelines.predict.stage import predict
from wsi.pipelines.train import train
from wsi.pipelines.train.finite import NonFiniteTrainingError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("predict-checks")
    cohort = make_cohort(root, n_patients=6)
    result = train(
        task=write_task(root / "task.yaml", epochs=1), labels_csv=cohort.labels, features_dir=cohort.bags,
        out_dir=root / "run", progress=False,
    )  # fmt: skip
    return cohort, result.run_dir


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _four_bags(cohort, folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    slides = sorted(cohort.slides)[:4]
    for slide in slides:
        (folder / f"{slide}.h5").write_bytes((cohort.bags / f"{slide}.h5").read_bytes())
    return slides


# --------------------------------------------------------------------------- results as slides finish
def test_an_interrupted_predict_resumes_where_it_stopped(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cohort, run = trained
    bags = tmp_path / "bags"
    slides = _four_bags(cohort, bags)
    labels = tmp_path / "labels.csv"
    labels.write_text("slide,label\n" + "".join(f"{s},{cohort.labels_of[s]}\n" for s in slides))
    kwargs = {"model_dir": run, "features_dir": bags, "progress": False, "labels_csv": labels}
    whole = predict(out_dir=tmp_path / "whole", **kwargs)  # the uninterrupted run to compare with

    computed: list[str] = []
    one_case = predict_module._predict_case

    def counted(run_model, case, *args, **kw):
        if len(computed) == 2 and interrupt:
            raise KeyboardInterrupt  # Ctrl-C after 2 of the 4 slides
        computed.append(case.id)
        return one_case(run_model, case, *args, **kw)

    monkeypatch.setattr(predict_module, "_predict_case", counted)
    out = tmp_path / "out"
    interrupt = True
    with pytest.raises(KeyboardInterrupt):
        predict(out_dir=out, **kwargs)
    assert [r["slide"] for r in _read(out / "predictions.csv")] == slides[:2]  # written as they finished
    assert [r["status"] for r in _read(out / "manifest.csv")] == ["ok", "ok"]
    assert len((out / PROGRESS_NAME).read_text().splitlines()) == 2

    interrupt, computed[:] = False, []
    again = predict(out_dir=out, **kwargs)
    assert computed == slides[2:]  # only the slides not finished before
    assert [r.status for r in again.results] == ["skipped", "skipped", "ok", "ok"]
    for name in ("predictions.csv", "patient_predictions.csv", "external_predictions.csv"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert json.loads((out / "metrics.json").read_text()) == json.loads(
        (tmp_path / "whole" / "metrics.json").read_text()
    )
    assert whole.metrics == again.metrics

    computed[:] = []
    predict(out_dir=out, overwrite=True, **kwargs)
    assert computed == slides  # --overwrite: every slide again
    computed[:] = []
    predict(out_dir=out, heatmaps=False, **kwargs)
    assert computed == slides  # other options: another result
    computed[:] = []
    (bags / f"{slides[1]}.h5").write_bytes((cohort.bags / f"{slides[1]}.h5").read_bytes())  # re-made
    predict(out_dir=out, heatmaps=False, **kwargs)
    assert computed == [slides[1]]


def test_a_cut_progress_line_is_predicted_again(trained, tmp_path: Path) -> None:
    cohort, run = trained
    bags = tmp_path / "bags"
    slides = _four_bags(cohort, bags)
    out = tmp_path / "out"
    predict(model_dir=run, features_dir=bags, out_dir=out, progress=False, heatmaps=False)
    lines = (out / PROGRESS_NAME).read_text().splitlines()
    (out / PROGRESS_NAME).write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])  # killed mid-line
    again = predict(model_dir=run, features_dir=bags, out_dir=out, progress=False, heatmaps=False)
    assert [r.status for r in again.results] == ["skipped"] * 3 + ["ok"]
    assert [r["slide"] for r in _read(out / "predictions.csv")] == slides


# ------------------------------------------------------------------------------------- NaN outputs
def test_a_nan_output_fails_its_slide_and_writes_no_row(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finite features, NaN outputs (an overflow): the slide fails by name, no `prob=nan`, no class."""
    cohort, run = trained
    bags = tmp_path / "bags"
    slides = _four_bags(cohort, bags)
    outputs = predict_module.RunModel.outputs
    n_tiles = {s: bag_length(bags / f"{s}.h5") for s in slides}
    assert list(n_tiles.values()).count(n_tiles[slides[2]]) == 1  # the bag is told apart by its length

    def nan_for_one(self, x, extra):
        out = outputs(self, x, extra)
        return out * torch.nan if x.shape[1] == n_tiles[slides[2]] else out

    monkeypatch.setattr(predict_module.RunModel, "outputs", nan_for_one)
    res = CliRunner().invoke(
        cli, ["predict", "--model", str(run), "--features", str(bags), "--out", str(tmp_path / "o"),
              "--no-progress"],
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    manifest = {r["slide"]: r for r in _read(tmp_path / "o" / "manifest.csv")}
    assert manifest[slides[2]]["status"] == "failed" and "NaN or infinite" in manifest[slides[2]]["error"]
    assert f"{slides[2]}.h5" in manifest[slides[2]]["error"]
    rows = _read(tmp_path / "o" / "predictions.csv")
    assert [r["slide"] for r in rows] == [s for s in slides if s != slides[2]]
    assert all(np.isfinite(float(r[c])) for r in rows for c in ("prob_LUAD", "prob_LUSC"))


# ----------------------------------------------------------------------------- options that cannot apply
def test_weights_are_refused_where_no_encoder_runs(trained, tmp_path: Path) -> None:
    cohort, run = trained
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"x")
    res = CliRunner().invoke(
        cli, ["predict", "--model", str(run), "--features", str(cohort.bags), "--out", str(tmp_path / "o"),
              "--weights", str(weights)],
    )  # fmt: skip
    assert res.exit_code == 2 and "--weights" in res.output and "leave --weights out" in res.output
    assert not (tmp_path / "o" / "predictions.csv").exists()
    from wsi.pipelines.predict.config import PredictOptions
    from wsi.pipelines.predict.raw_slides import embed_raw_slides

    prov = {"encoder": "timm:resnet18", "weights_sha256": "random", "tile_params": {"tile_um": 96.0}}
    with pytest.raises(ConfigError, match=r"randomly initialised.*--weights cannot apply"):
        embed_raw_slides(
            prov, [tmp_path], tmp_path / "work", PredictOptions(weights=weights, device="cpu", progress=False)
        )


def test_an_out_folder_that_cannot_be_written_is_refused_before_any_work(trained, tmp_path: Path) -> None:
    cohort, run = trained
    (tmp_path / "a-file").write_text("x")
    res = CliRunner().invoke(
        cli, ["predict", "--model", str(run), "--features", str(cohort.bags), "--out",
              str(tmp_path / "a-file" / "preds")],
    )  # fmt: skip
    assert res.exit_code == 2 and "--out" in res.output and "Traceback" not in res.output


# ------------------------------------------------------------------------------- raw slides and slides
def _fake_raw_run(run: Path, tmp_path: Path) -> Path:
    """The trained run, told its bags came from a random timm:resnet18 on 96 um tiles (for raw slides)."""
    fake = tmp_path / "raw-run"
    fake.mkdir()
    for name in ("best.safetensors", "config.json"):
        (fake / name).write_bytes((run / name).read_bytes())
    config = json.loads((fake / "config.json").read_text())
    config["input"]["provenance"].update(
        encoder="timm:resnet18", weights_sha256="random", input_px=32, precision="fp32",
        tile_params={"tile_um": 96.0, "tile_px": 32, "min_blur_variance": 0.0},
    )  # fmt: skip
    (fake / "config.json").write_text(json.dumps(config))
    return fake


def test_a_raw_slide_that_kept_no_tile_is_in_the_manifest(trained, tmp_path: Path) -> None:
    from wsi.synthetic import write_sample_slide

    _, run = trained
    slide = write_sample_slide(tmp_path / "blank.svs", size_um=600, mpp=1.0, tissue_boxes_um=[]).path
    res = CliRunner().invoke(
        cli, ["predict", "--model", str(_fake_raw_run(run, tmp_path)), str(slide), "--out",
              str(tmp_path / "o"), "--device", "cpu", "--no-progress"],
    )  # fmt: skip
    assert res.exit_code == 1, res.output  # an empty slide is no silent success
    rows = _read(tmp_path / "o" / "manifest.csv")
    assert [(r["slide"], r["status"]) for r in rows] == [("blank", "empty")]
    assert "no tissue" in rows[0]["error"] and "--min-saturation" in rows[0]["error"]
    assert "1 empty" in res.output


def _bag_of_a_slide(path: Path, slide: Path | None, *, n: int = 6) -> None:
    rng = np.random.default_rng(1)
    coords_um = np.stack([np.arange(n) % 3, np.arange(n) // 3], axis=1).astype(np.float32) * 128.0
    provenance = BagProvenance(
        slide_id=path.stem, encoder="test-encoder", weights_sha256="0" * 64, tile_um=128.0,
        tile_px=128, mpp=1.0, level0_width=600, level0_height=600,
        tile_params={"tile_um": 128.0, "tile_px": 128}, slide_path=None if slide is None else str(slide),
    )  # fmt: skip
    feats = rng.normal(size=(n, IN_DIM)).astype(np.float32)
    write_bag(
        path, feats=feats, coords_um=coords_um, coords_px=coords_um.astype(np.int64), provenance=provenance
    )


def test_bag_heatmaps_draw_over_the_slide_when_it_is_reachable(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wsi.synthetic import write_sample_slide

    _, run = trained
    slide = write_sample_slide(tmp_path / "s.svs", size_um=600, mpp=1.0).path
    bags = tmp_path / "bags"
    bags.mkdir()
    _bag_of_a_slide(bags / "here.h5", slide)
    _bag_of_a_slide(bags / "moved.h5", tmp_path / "elsewhere" / "s.svs")
    drawn: list[Path] = []
    import wsi.pipelines.predict.explain as explain_module

    over_slide = explain_module.slide_heatmap

    def spy(thumb, *args, **kw):
        drawn.append(Path(thumb[0]))
        return over_slide(thumb, *args, **kw)

    monkeypatch.setattr(explain_module, "slide_heatmap", spy)
    result = predict(model_dir=run, features_dir=bags, out_dir=tmp_path / "o", progress=False)
    assert [r.status for r in result.results] == ["ok", "ok"]
    assert drawn == [slide]  # `here` over its slide; `moved` (slide not reachable) on a blank canvas
    for name in ("here", "moved"):
        assert (tmp_path / "o" / "heatmaps" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------------------- images
def test_images_with_nan_pixels_fail_by_name_in_predict_and_stop_training(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image input goes through the same checks: a NaN image (a float .npy, a bad DICOM rescale)
    fails its row in predict and stops training naming it; --weights is refused for an image run."""
    import yaml
    from PIL import Image

    from wsi.core.config import config_dict
    from wsi.pipelines.inputs.images import ImageInput
    from wsi.pipelines.study.tasks import load_task

    folder = tmp_path / "derm"
    folder.mkdir()
    sources = sorted((shared_data / "derm").glob("ISIC_*.jpg"))
    rows = ["image_name,benign_malignant,patient_id"]
    for i in range(8):
        with Image.open(sources[i % len(sources)]) as img:
            img.crop((i * 10, 0, i * 10 + 200, 160)).save(folder / f"lesion{i}.jpg")
        rows.append(f"lesion{i}.jpg,{('benign', 'malignant')[i % 2]},P{i}")
    labels = tmp_path / "derm.csv"
    labels.write_text("\n".join(rows) + "\n")
    data = config_dict(load_task("isic-melanoma"))
    data["model"]["overrides"] = {"dim": 16, "attn_dim": 16, "depth": 1, "heads": 2, "mlp_dim": 16}
    data["input_options"]["size_px"] = 32
    data.update(bootstrap=10, num_workers=0, batch_size=2, epochs=1)
    task = tmp_path / "task.yaml"
    task.write_text(yaml.safe_dump(data))
    run = train(task=task, labels_csv=labels, images_dir=folder, out_dir=tmp_path / "run", device="cpu",
                progress=False).run_dir  # fmt: skip

    dataset = ImageInput.dataset

    def nan_image(self, items, *, train):
        base = dataset(self, items, train=train)

        class WithNaN(torch.utils.data.Dataset):
            def __len__(self):
                return len(base)

            def __getitem__(self, i):
                sample = base[i]
                if sample["id"] == "lesion3":
                    sample = {**sample, "x": sample["x"].float() * torch.nan}
                return sample

        return WithNaN()

    monkeypatch.setattr(ImageInput, "dataset", nan_image)
    result = predict(model_dir=run, inputs=[folder], out_dir=tmp_path / "o", device="cpu", progress=False)
    status = {r.slide_id: r for r in result.results}
    assert status["lesion3"].status == "failed" and "NaN or infinite" in status["lesion3"].error
    assert sorted(r["slide"] for r in result.rows) == [f"lesion{i}" for i in range(8) if i != 3]
    cells = [
        c for r in _read(tmp_path / "o" / "predictions.csv") for k, c in r.items() if k.startswith("prob")
    ]
    assert all(np.isfinite(float(c)) for c in cells)  # no prob=nan row
    with pytest.raises(ConfigError, match="leave --weights out"):
        predict(model_dir=run, inputs=[folder], out_dir=tmp_path / "o2", weights=labels, progress=False)
    with pytest.raises(NonFiniteTrainingError, match=r"lesion3"):
        train(task=task, labels_csv=labels, images_dir=folder, out_dir=tmp_path / "run2", device="cpu",
              progress=False)  # fmt: skip


def test_the_summary_line_says_which_slides_an_earlier_call_predicted(trained, tmp_path: Path) -> None:
    """A re-run that predicted nothing new says so, rather than `4 slide(s) predicted`."""
    cohort, run = trained
    bags = tmp_path / "bags"
    _four_bags(cohort, bags)
    argv = ["predict", "--model", str(run), "--features", str(bags), "--out", str(tmp_path / "out"),
            "--no-heatmaps", "--no-geojson", "--no-progress"]  # fmt: skip
    first = CliRunner().invoke(cli, argv)
    assert first.exit_code == 0 and "4 slide(s) predicted, 0 failed" in first.output, first.output
    again = CliRunner().invoke(cli, argv)
    assert again.exit_code == 0, again.output
    assert "0 slide(s) predicted, 4 already predicted (--overwrite redoes them), 0 failed" in again.output

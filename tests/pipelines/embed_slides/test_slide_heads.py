"""Studies on slide embeddings: `wsi train --features EMBEDDINGS` trains the linear / MLP head for every
task kind (slide and patient level, CV, report), and `wsi predict --features` refuses other encoders."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from kinds_cohorts import make_kind_cohort, write_kind_task
from slide_bags import embed_by_mean, make_bag

from wsi.cli.main import cli
from wsi.models import build_model
from wsi.pipelines.embed_slides import embed_slides
from wsi.pipelines.train import train


def test_bag_task_switches_to_the_head_on_embeddings(tmp_path: Path) -> None:
    from wsi.pipelines.inputs import build_input
    from wsi.pipelines.study.tasks import load_task
    from wsi.pipelines.train.recipe import apply_recipe
    from wsi.pipelines.train.slide_level import for_features

    make_bag(tmp_path / "bags" / "s.h5")
    task = load_task("nsclc-subtype")
    assert for_features(task, tmp_path / "bags") is task  # tile bags: the MIL model as before
    emb = embed_by_mean(tmp_path / "bags", tmp_path / "emb")
    switched = for_features(task, emb)
    assert switched.input == "slide-embeddings" and switched.model.attention is None
    # the preset is the recipe's choice (one place): the linear head, the MIL model's overrides dropped
    mil = switched.replace(**{"model.overrides": {"depth": 1}})
    head = apply_recipe(mil, n_train=10).model
    assert head.preset == "linear" and head.attention is None and "depth" not in head.overrides
    kept = apply_recipe(for_features(task.replace(**{"model.preset": "mlp"}), emb), n_train=10)
    assert kept.model.preset == "mlp"
    adapter = build_input("slide-embeddings")
    found = adapter.find([emb])
    from wsi.pipelines.inputs import Item

    items = [Item(id=k, path=v, label=0) for k, v in found.items()]
    sample = adapter.dataset(items, train=True)[0]
    assert sample["x"].shape == (1, 768) and adapter.model_kwargs(items) == {"in_dim": 768}
    prov = adapter.provenance(items)
    assert prov["encoder"] == "toy-slide" and prov["tile_encoder"] == "test-encoder"
    adapter.check_compatible(prov, items)
    with pytest.raises(Exception, match="trained on toy-other embeddings"):
        adapter.check_compatible({**prov, "encoder": "toy-other"}, items)
    bag_dir = tmp_path / "bags"
    with pytest.raises(Exception, match="not one vector: it is a bag of tile features"):
        adapter.dataset([Item(id="s", path=bag_dir / "s.h5")], train=False)[0]


def test_heads_are_model_kinds() -> None:
    for preset in ("linear", "mlp"):
        model = build_model(preset, in_dim=12, num_classes=3).eval()
        x, mask = torch.randn(2, 3, 12), torch.tensor([[True, True, False], [True, False, False]])
        logits = model(x, mask)
        assert logits.shape == (2, 3)
        # a patient's slides are averaged (late fusion): padding rows change nothing
        torch.testing.assert_close(model(x[1:, :1]), logits[1:])
    lin = build_model("linear", in_dim=12, num_classes=3).eval()
    torch.testing.assert_close(lin.tile_contributions(x, mask).sum(1) + lin.out.bias, lin(x, mask))


@pytest.mark.slow  # ~1 min each on 2 busy cores (the report's figures and bootstrap)
@pytest.mark.parametrize("kind,preset", [("regression", "mlp"), ("survival", "linear"),
                                         ("multi-target", "linear")])  # fmt: skip
def test_every_task_kind_trains_on_embeddings(tmp_path: Path, kind: str, preset: str) -> None:
    level = "slide" if kind == "regression" else "patient"
    cohort = make_kind_cohort(tmp_path, kind=kind, n_patients=30, slides_per_patient=(1, 2))
    emb = embed_by_mean(cohort.bags, tmp_path / "emb")
    task = write_kind_task(tmp_path / "task.yaml", kind, level=level, epochs=15)
    changes = {"model.preset": preset, "model.overrides": {}, "optimizer.lr": 1e-2}
    result = train(task=task, labels_csv=cohort.labels, features_dir=emb, out_dir=tmp_path / "run",
                   progress=False, overrides=changes)  # fmt: skip
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["input"]["name"] == "slide-embeddings" and record["model"]["kind"] == preset
    assert record["input"]["provenance"]["encoder"] == "toy-slide"
    m = result.metrics
    value = {"regression": m.get("pearson_r"), "survival": m.get("c_index"),
             "multi-target": m.get("targets", {}).get("tp53", {}).get("auroc")}[kind]  # fmt: skip
    assert value is not None and value > 0.6, (kind, m)
    assert (tmp_path / "run" / "report.html").is_file()


@pytest.mark.slow  # ~2 min on 2 busy cores: two folds, their reports, then predict
def test_embed_train_cv_and_predict_through_the_cli(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(24):
        label = "LUSC" if i % 2 else "LUAD"
        path = tmp_path / "bags" / f"S{i:02d}.h5"
        make_bag(path, seed=i, n=20)
        import h5py

        with h5py.File(path, "r+") as h5:  # a class signal every tile carries
            h5["feats"][:, :8] += 2.0 if label == "LUSC" else -2.0
        rows.append({"slide": f"S{i:02d}", "patient": f"P{i:02d}", "label": label})
    labels = tmp_path / "labels.csv"
    with labels.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["slide", "patient", "label"])
        writer.writeheader()
        writer.writerows(rows)
    del rng
    runner = CliRunner()
    r = runner.invoke(cli, ["embed-slides", "--features", str(tmp_path / "bags"), "--encoder", "feather",
                            "--random-init", "--out", str(tmp_path / "emb")])  # fmt: skip
    assert r.exit_code == 0, r.output
    folder = tmp_path / "emb" / "feather-slide"
    r = runner.invoke(cli, ["train", "--task", "nsclc-subtype", "--features", str(folder), "--labels",
                            str(labels), "--out", str(tmp_path / "run"), "--cv", "2", "--epochs", "20",
                            "--no-progress", "--device", "cpu"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "2-fold AUROC" in r.output
    assert (tmp_path / "run" / "report.html").is_file() and (tmp_path / "run" / "fold-1").is_dir()
    run = tmp_path / "run" / "fold-1"
    r = runner.invoke(cli, ["predict", "--model", str(run), "--features", str(folder), "--out",
                            str(tmp_path / "pred"), "--device", "cpu"])  # fmt: skip
    assert r.exit_code == 0, r.output
    preds = list(csv.DictReader((tmp_path / "pred" / "predictions.csv").open()))
    assert len(preds) == 24
    # embeddings of another slide encoder are refused, naming both
    make_bag(tmp_path / "ct" / "S00.h5", encoder="ctranspath", mpp=1.0,
             sha="1646f23001214f74cf432ef0e80b808ee6605143802ae6ed53a87564ddc4924a")  # fmt: skip
    embedded = embed_slides(tmp_path / "ct", encoder="chief", random_init=True, out_dir=tmp_path / "o")
    other, _ = embedded.folder, list(embedded)
    r = runner.invoke(cli, ["predict", "--model", str(run), "--features", str(other), "--out",
                            str(tmp_path / "pred2"), "--device", "cpu"])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "trained on feather embeddings" in r.output and "S00.h5: chief" in r.output


@pytest.mark.slow  # tiles and embeds four synthetic slides, trains, predicts twice (~1 min)
def test_raw_slides_chain_tile_encoder_slide_encoder_and_head(tmp_path: Path) -> None:
    """Predicting raw slides with a head trained on slide embeddings remakes the tile features, then the
    slide embeddings, with the recorded settings: the same probabilities as predicting the embeddings."""
    from wsi.models.slide_encoders import SLIDE_ENCODERS, SlideEncoderSpec
    from wsi.models.slide_encoders.feather import FeatherConch15
    from wsi.pipelines.embed.engine import EmbedOptions
    from wsi.pipelines.embed.stage import tile_and_embed as embed_tiles
    from wsi.pipelines.predict.stage import predict
    from wsi.slides.sources import find_slides
    from wsi.synthetic import write_sample_cohort
    from wsi.tiling.params import TileParams

    if "test-feather" not in SLIDE_ENCODERS:

        class TestFeather(FeatherConch15):  # FEATHER's architecture over 512-d resnet18 features
            IN_DIM = 512
            SPEC = SlideEncoderSpec(
                tile_encoders=("timm:resnet18",), tile_um=96.0, tile_mpp=3.0, in_dim=512, dim=512,
                params=0, licence="test", weights_page="test", weights_files=("w.safetensors",),
                reference="test", uses_positions=False, patient_fusion="late",
            )  # fmt: skip

        SLIDE_ENCODERS.register("test-feather")(TestFeather)
    slides = write_sample_cohort(tmp_path / "slides", n=4, size_um=800, mpp=1.0, styles=("a", "b"))
    options = EmbedOptions(encoder="timm:resnet18", random_init=True, input_px=32, device="cpu", readers=0)
    params = TileParams(tile_um=96, tile_px=32, min_blur_variance=0)
    embed_tiles(find_slides([tmp_path / "slides"]), out_dir=tmp_path / "emb", options=options,
                tile_params=params, progress=False)  # fmt: skip
    bags = tmp_path / "emb" / "features" / "timm-resnet18"
    embedded = embed_slides(bags, encoder="test-feather", random_init=True, out_dir=tmp_path / "emb")
    folder, _ = embedded.folder, list(embedded)
    labels = tmp_path / "labels.csv"
    labels.write_text("slide,label\n" + "".join(f"{s.path.stem},{('LUAD', 'LUSC')[i % 2]}\n"
                                                for i, s in enumerate(slides)))  # fmt: skip
    task = write_kind_task(tmp_path / "t.yaml", "regression")  # replaced below: a categorical task
    task.write_text(task.read_text().replace("kind: regression", "kind: categorical").replace(
        "targets:\n- column: purity\n", "classes: [LUAD, LUSC]\n"))  # fmt: skip
    train(task=task, labels_csv=labels, features_dir=folder, out_dir=tmp_path / "run", progress=False,
          overrides={"epochs": 2, "split.train": 0.5, "split.val": 0.25, "split.test": 0.25})  # fmt: skip
    prov = json.loads((tmp_path / "run" / "config.json").read_text())["input"]["provenance"]
    assert prov["encoder"] == "test-feather" and prov["tile_provenance"]["encoder"] == "timm:resnet18"
    targets = [slides[0].path, slides[3].path]
    raw = predict(model_dir=tmp_path / "run", inputs=targets, out_dir=tmp_path / "p1", progress=False)
    emb = predict(model_dir=tmp_path / "run", features_dir=folder, out_dir=tmp_path / "p2", progress=False)
    by_emb = {r["slide"]: r for r in emb.rows}
    assert [r["slide"] for r in raw.rows] == [slides[0].path.stem, slides[3].path.stem]
    for row in raw.rows:
        assert row["prob_LUSC"] == pytest.approx(by_emb[row["slide"]]["prob_LUSC"], abs=1e-5)
    with pytest.raises(Exception, match="randomly initialised test-feather"):
        predict(model_dir=tmp_path / "run", inputs=targets, out_dir=tmp_path / "p3", progress=False,
                slide_weights=str(labels))  # fmt: skip

"""Per-feature standardisation of bag features (`standardize_features: true`, issue 22 item 3): fitted on
each fold's training tiles only, stored in the weights, applied identically by the evaluation at the
end of training and by `wsi predict` (bags loaded whole and streamed), blind to a feature's scale; run
folders without it predict as before."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from cohorts import make_cohort, write_task

from wsi.core.errors import ConfigError
from wsi.formats.bags import read_bag
from wsi.models.layers.standardize import MEAN_KEY, SCALE_KEY, input_standardizer
from wsi.pipelines.predict.run_model import load_run
from wsi.pipelines.predict.stage import predict
from wsi.pipelines.runs.checkpoints import load_weights
from wsi.pipelines.study.tasks import parse_task
from wsi.pipelines.train import train
from wsi.pipelines.train.augment import centred_dropout
from wsi.pipelines.train.feature_stats import RunningMoments, fit_feature_stats

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = {"dim": 16, "attn_dim": 16, "depth": 1, "heads": 2, "mlp_dim": 16}
FIXTURES = Path(__file__).parents[2] / "fixtures" / "run-v1"


def _task(root: Path, **changes: object) -> Path:
    fields: dict[str, object] = {"epochs": 3, "patience": 0, "bootstrap": 20, "standardize_features": True}
    fields["recipe"] = "small-cohort"  # tile subsets, feature dropout, weights averaged over epochs
    fields["model"] = {"preset": "vit-wsi", "attention": "seqnorm", "overrides": SMALL}
    return write_task(root / "task.yaml", **{**fields, **changes})


def _rows(path: Path) -> dict[str, dict[str, str]]:
    with path.open(newline="") as fh:
        return {r["slide"]: r for r in csv.DictReader(fh)}


def _split(fold: Path, part: str) -> list[str]:
    return [s for s, r in _rows(fold / "splits.csv").items() if r["split"] == part]


def _no_report(mp: pytest.MonkeyPatch) -> None:
    """The statistics report (bootstrap bands, figures) takes most of a tiny run's time; these tests
    read predictions and weights only (test_report.py checks the report)."""
    import wsi.pipelines.train.evaluate as evaluate
    import wsi.pipelines.train.results as results

    for module in (evaluate, results):
        mp.setattr(module, "write_report", lambda *a, **k: None)


@pytest.fixture(scope="module")
def cv_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(bags folder, run folder) of a seeded 2-fold run with standardize_features on."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("std-cv")
    cohort = make_cohort(root, n_patients=12)
    with pytest.MonkeyPatch.context() as mp:
        _no_report(mp)
        train(
            task=_task(root), labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=root / "run",
            progress=False, cv=2,
        )  # fmt: skip
    return cohort.bags, root / "run"


def test_running_moments_merge_blocks_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chan's merge over uneven blocks equals numpy's two-pass float64 mean and sd, also for a feature
    whose mean is 10^6 sds from 0 (where sum(x^2) - n mean^2 would cancel to noise)."""
    import wsi.pipelines.train.feature_stats as fs

    monkeypatch.setattr(fs, "BLOCK_ROWS", 7)
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(1000, 5))
    rows[:, 1] = 1e4 + 1e-2 * rows[:, 1]
    rows[:, 2] *= 1000.0
    moments = RunningMoments()
    for part in np.array_split(rows, [1, 50, 51, 400]):  # blocks of 1, 49, 1, 349, 600 rows
        moments.add(part)
    assert moments.n == 1000
    np.testing.assert_allclose(moments.mean, rows.mean(0), rtol=1e-12)
    np.testing.assert_allclose(moments.sd(), rows.std(0), rtol=1e-9)


def test_each_fold_stores_the_mean_and_sd_of_its_own_training_tiles(cv_run: tuple[Path, Path]) -> None:
    bags, run = cv_run
    seen = []
    for fold in (run / "fold-1", run / "fold-2"):
        train_ids = _split(fold, "train")
        held_out = _split(fold, "val") + _split(fold, "test")
        assert train_ids and held_out and not set(train_ids) & set(held_out)
        tiles = np.concatenate([read_bag(bags / f"{s}.h5").feats.astype(np.float64) for s in train_ids])
        for name in ("best.safetensors", "last.safetensors"):
            state = load_weights(fold / name)
            # float32 of numpy's float64 figures (averaged weights keep them bit for bit)
            np.testing.assert_allclose(state[MEAN_KEY].numpy(), tiles.mean(0), rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(state[SCALE_KEY].numpy(), tiles.std(0), rtol=1e-6)
        everything = np.concatenate(
            [read_bag(bags / f"{s}.h5").feats.astype(np.float64) for s in train_ids + held_out]
        )
        assert np.abs(state[MEAN_KEY].numpy() - everything.mean(0)).max() > 1e-3  # not val/test tiles
        seen.append(state[MEAN_KEY].numpy())
    assert np.abs(seen[0] - seen[1]).max() > 1e-3  # each fold its own


def test_the_stored_standardisation_round_trips_into_predict(cv_run: tuple[Path, Path]) -> None:
    _, run = cv_run
    loaded = load_run(run, device="cpu")
    assert len(loaded.models) == 2
    for model, ckpt in zip(loaded.models, loaded.checkpoints, strict=True):
        module = input_standardizer(model)
        assert module is not None
        state = load_weights(ckpt)
        assert torch.equal(module.mean, state[MEAN_KEY]) and torch.equal(module.scale, state[SCALE_KEY])


@pytest.mark.parametrize("stream", [False, True])
def test_predict_gives_the_evaluation_probabilities(
    cv_run: tuple[Path, Path], tmp_path: Path, stream: bool
) -> None:
    """`wsi predict` on a fold's folder repeats the probabilities its evaluation wrote at the end of
    training for its test bags, with bags loaded whole and streamed chunk by chunk."""
    bags, run = cv_run
    fold = run / "fold-1"
    result = predict(
        model_dir=fold, features_dir=bags, out_dir=tmp_path / "p", progress=False, heatmaps=False,
        stream_above_tiles=1 if stream else None,
    )  # fmt: skip
    got, evaluated = _rows(result.predictions_csv), _rows(fold / "test_predictions.csv")
    assert evaluated
    for slide, row in evaluated.items():
        assert got[slide]["predicted"] == row["predicted"], slide
        for column in ("prob_LUAD", "prob_LUSC"):
            assert abs(float(got[slide][column]) - float(row[column])) <= 2e-6, (slide, column)


def test_weights_that_disagree_with_the_record_are_refused(cv_run: tuple[Path, Path], tmp_path: Path) -> None:
    _, run = cv_run
    fold = tmp_path / "fold"
    shutil.copytree(run / "fold-1", fold)
    config = fold / "config.json"
    text = config.read_text()
    config.write_text(text.replace('"standardize_features": true', '"standardize_features": false'))
    with pytest.raises(ConfigError, match="input standardisation"):
        load_run(fold, device="cpu")


def _scale_feature(src: Path, dst: Path, feature: int, factor: float) -> None:
    dst.mkdir()
    for bag in sorted(src.glob("*.h5")):
        shutil.copy(bag, dst / bag.name)
        with h5py.File(dst / bag.name, "r+") as h5:
            h5["feats"][:, feature] = h5["feats"][:, feature] * factor


def _probs(result_dir: Path) -> np.ndarray:
    rows = _rows(result_dir / "test_predictions.csv")
    return np.array([float(rows[s]["prob_LUSC"]) for s in sorted(rows)])


def test_a_feature_scaled_1000x_trains_the_same_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Feature 0 carries the class signal; multiplied by 1000 in every bag, a seeded run with
    standardisation on predicts (nearly) the same, and one without it does not."""
    _no_report(monkeypatch)
    cohort = make_cohort(tmp_path, n_patients=12)
    scaled = tmp_path / "scaled"
    _scale_feature(cohort.bags, scaled, feature=0, factor=1000.0)
    probs = {}
    for name, bags, on in (("plain", cohort.bags, True), ("x1000", scaled, True), ("raw", scaled, False)):
        out = tmp_path / name
        train(
            task=_task(tmp_path, standardize_features=on), labels_csv=cohort.labels, features_dir=bags,
            out_dir=out, progress=False,
        )  # fmt: skip
        probs[name] = _probs(out)
    assert np.abs(probs["plain"] - probs["x1000"]).max() < 2e-3, probs
    assert np.abs(probs["plain"] - probs["raw"]).max() > 2e-2, probs  # the scale did matter without it


def test_feature_dropout_drops_to_the_mean() -> None:
    """With standardisation, training-time feature dropout acts on z-scores: a dropped feature becomes
    its mean, a kept one keeps its deviation scaled by 1 / (1 - p)."""
    torch.manual_seed(0)
    x = 500.0 + torch.randn(4, 50, 8)
    center = torch.full((8,), 500.0)
    out = centred_dropout(x, 0.5, center)
    dropped = out == 500.0
    assert 0.3 < dropped.float().mean() < 0.7
    torch.testing.assert_close(out[~dropped] - 500.0, 2.0 * (x[~dropped] - 500.0))


def test_a_constant_feature_is_centred_not_scaled(tmp_path: Path) -> None:
    from wsi.pipelines.inputs import Item, build_input

    cohort = make_cohort(tmp_path, n_patients=4)
    for bag in cohort.bags.glob("*.h5"):
        with h5py.File(bag, "r+") as h5:
            h5["feats"][:, 5] = 3.0
    items = [Item(id=s, path=cohort.bags / f"{s}.h5", label=0) for s in cohort.slides]
    stats = fit_feature_stats(build_input("bags", {}), items)
    assert stats.unscaled.tolist() == [i == 5 for i in range(16)]
    mean, scale = stats.tensors()
    assert float(mean[5]) == 3.0 and float(scale[5]) == 1.0
    assert stats.n_tiles == sum(len(read_bag(cohort.bags / f"{s}.h5")) for s in cohort.slides)


def test_old_run_folders_hold_no_standardisation_and_predict_as_before(tmp_path: Path) -> None:
    """A run folder written before standardisation existed (tests/fixtures/run-v1) loads without one
    and predicts the probabilities its own code wrote (test_run_record checks every layout)."""
    run = tmp_path / "single"
    shutil.copytree(FIXTURES / "single", run)
    loaded = load_run(run, device="cpu")
    assert input_standardizer(loaded.models[0]) is None and not loaded.record.task.standardize_features
    cohort = make_cohort(tmp_path / "cohort", n_patients=12)  # the seeded bags the fixture predicted
    result = predict(model_dir=run, features_dir=cohort.bags, out_dir=tmp_path / "p", progress=False,
                     heatmaps=False)  # fmt: skip
    got, expected = _rows(result.predictions_csv), _rows(run / "expected_predictions.csv")
    assert got.keys() == expected.keys()
    for slide, row in expected.items():
        assert abs(float(got[slide]["prob_LUSC"]) - float(row["prob_LUSC"])) <= 1.01e-6, slide


def test_images_refuse_standardize_features() -> None:
    with pytest.raises(ConfigError, match="standardize_features"):
        parse_task({"name": "x", "classes": ["a", "b"], "input": "images", "standardize_features": True},
                   source="t.yaml")  # fmt: skip


def test_slide_embeddings_are_standardised_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A head on slide embeddings (`input: slide-embeddings`) gets the same treatment: its training
    slides' embedding mean and sd in its weights, and predict repeats the evaluation."""
    from slide_bags import embed_by_mean as _embed_by_mean

    _no_report(monkeypatch)
    cohort = make_cohort(tmp_path, n_patients=12)
    emb = _embed_by_mean(cohort.bags, tmp_path / "emb")
    run = tmp_path / "run"
    train(task=_task(tmp_path), labels_csv=cohort.labels, features_dir=emb, out_dir=run, progress=False)
    train_ids = _split(run, "train")
    bags = [read_bag(cohort.bags / f"{s}.h5").feats.astype(np.float32) for s in train_ids]
    vectors = np.stack([b.mean(0) for b in bags])  # what _embed_by_mean wrote
    state = load_weights(run / "best.safetensors")
    np.testing.assert_allclose(state[MEAN_KEY].numpy(), vectors.mean(0), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(state[SCALE_KEY].numpy(), vectors.std(0), rtol=1e-3, atol=1e-3)
    result = predict(model_dir=run, features_dir=emb, out_dir=tmp_path / "p", progress=False, heatmaps=False)
    got = _rows(result.predictions_csv)
    for slide, row in _rows(run / "test_predictions.csv").items():
        assert abs(float(got[slide]["prob_LUSC"]) - float(row["prob_LUSC"])) <= 2e-6, slide


@pytest.mark.slow  # tiles and embeds four synthetic slides, trains, predicts twice (~1 min)
def test_raw_slides_predict_as_their_bags_with_standardisation(tmp_path: Path) -> None:
    """Predicting raw slides (tile + embed at predict time) with a standardised run gives the
    probabilities of predicting their bags, which are the evaluation's."""
    from wsi.pipelines.embed.engine import EmbedOptions
    from wsi.pipelines.embed.stage import tile_and_embed
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
        "slide,label\n" + "".join(f"{s.path.stem},{('LUAD', 'LUSC')[i % 2]}\n" for i, s in enumerate(slides))
    )
    bags = tmp_path / "emb" / "features" / "timm-resnet18"
    run = tmp_path / "run"
    train(task=_task(tmp_path, epochs=2), labels_csv=labels, features_dir=bags, out_dir=run, progress=False)
    assert input_standardizer(load_run(run, device="cpu").models[0]) is not None
    targets = [s.path for s in slides]
    from_slides = predict(model_dir=run, inputs=targets, out_dir=tmp_path / "p1", progress=False)
    from_bags = predict(model_dir=run, features_dir=bags, out_dir=tmp_path / "p2", progress=False)
    by_bag = {r["slide"]: r for r in from_bags.rows}
    assert len(from_slides.rows) == len(slides)
    for row in from_slides.rows:
        assert row["prob_LUSC"] == pytest.approx(by_bag[row["slide"]]["prob_LUSC"], abs=1e-5)
    (evaluated,) = run.glob("*_predictions.csv")  # test, or val when 4 slides leave no test split
    for slide, row in _rows(evaluated).items():
        assert float(by_bag[slide]["prob_LUSC"]) == pytest.approx(float(row["prob_LUSC"]), abs=2e-6)

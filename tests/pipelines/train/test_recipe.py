"""Training recipes (issue 14): what a task that names only its classes gets, what nsclc-subtype keeps,
the preset sized to the cohort, tile subsets in training only, smoothed-loss selection with weight
averaging, and ABMIL through train -> predict with heatmaps."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from cohorts import CLASSES, IN_DIM, make_bag, make_cohort, write_task
from safetensors.torch import load_file

from wsi.core.errors import ConfigError
from wsi.formats.bags import read_bag
from wsi.models.presets import build_model
from wsi.pipelines.inputs import Batch
from wsi.pipelines.predict.stage import load_run, predict
from wsi.pipelines.study.tasks import load_task, parse_task
from wsi.pipelines.train import train
from wsi.pipelines.train.augment import MIN_SUBSET_TILES, BagAugment, tile_subset
from wsi.pipelines.train.loop import require_recipe
from wsi.pipelines.train.recipe import RECIPES, SMALL_BELOW, apply_recipe, preset_for
from wsi.pipelines.train.selection import Selection, smoothed_loss

TINY_ABMIL = {"hidden_dim": 16, "attn_dim": 8}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _task_yaml(path: Path, **fields: Any) -> Path:
    """A user's task YAML that names its classes (and whatever `fields` add)."""
    path.write_text(yaml.safe_dump({"name": "toy", "classes": list(CLASSES), "bootstrap": 20, **fields}))
    return path


# ----------------------------------------------------------------------------------- the recipe rules
def test_a_task_naming_only_its_classes_gets_the_small_cohort_recipe(tmp_path: Path) -> None:
    task = load_task(_task_yaml(tmp_path / "t.yaml"))
    assert task.recipe == "small-cohort" and task.model.preset is None and task.model.attention is None
    with pytest.raises(ConfigError, match="recipe"):
        require_recipe(task)  # the loop refuses a task whose recipe was never applied
    r = apply_recipe(task, n_train=60)
    want = RECIPES["small-cohort"]
    assert (r.model.preset, r.model.attention) == ("vit-wsi-small", "seqnorm")
    assert r.model.overrides == dict(want.model_overrides["mil"])
    assert (r.epochs, r.patience) == (want.epochs, want.patience)
    opt = r.optimizer
    assert (opt.lr, opt.weight_decay, opt.schedule, opt.warmup_epochs) == (
        want.lr_by_kind["mil"], want.weight_decay, want.schedule, want.warmup_epochs,
    )  # fmt: skip
    abmil = apply_recipe(task.replace(**{"model.preset": "abmil"}), n_train=60)
    assert abmil.optimizer.lr == want.lr != want.lr_by_kind["mil"]  # the learning rate is per model kind
    assert abmil.model.overrides == dict(want.model_overrides["abmil"])
    assert r.augment.tile_fraction == want.tile_fraction and 0 < want.tile_fraction[0] < 1
    assert r.augment.feature_dropout == want.feature_dropout > 0
    assert (r.selection.metric, r.selection.window, r.selection.average_weights) == (
        "smoothed-val-loss", want.window, True,
    )  # fmt: skip
    assert require_recipe(r) == want.epochs
    assert apply_recipe(task, n_train=SMALL_BELOW).model.preset == "vit-wsi"


@pytest.mark.parametrize(
    ("recipe", "n_train", "input_name", "preset"),
    [
        ("small-cohort", 1, "bags", "vit-wsi-small"),
        ("small-cohort", SMALL_BELOW - 1, "bags", "vit-wsi-small"),
        ("small-cohort", SMALL_BELOW, "bags", "vit-wsi"),
        ("small-cohort", 5000, "bags", "vit-wsi"),
        ("paper", 40, "bags", "vit-wsi"),
    ],
)
def test_preset_is_sized_by_the_number_of_training_cases(
    recipe: str, n_train: int, input_name: str, preset: str
) -> None:
    assert SMALL_BELOW == 300  # the documented rule (README.md, pipelines/train/recipe.py)
    assert preset_for(recipe, n_train, input_name) == preset


@pytest.mark.parametrize(
    ("recipe", "input_options", "preset"),
    [
        ("small-cohort", {}, "vit-2d"),
        ("small-cohort", {"size_px": 224}, "vit-2d"),
        ("paper", {"size_px": [224, 224]}, "vit-2d"),
        ("small-cohort", {"size_px": [32, 256, 256]}, "vit-3d"),
    ],
)
def test_an_image_task_naming_no_preset_gets_an_image_vit(
    recipe: str, input_options: dict[str, object], preset: str
) -> None:
    """vit-wsi reads feature bags: an image YAML naming only its classes got it and failed on its
    `in_channels` (configs/models/vit-wsi.yaml: unknown field)."""
    assert preset_for(recipe, 40, "images", input_options) == preset


def test_an_image_yaml_naming_only_its_classes_builds_its_vit(tmp_path: Path) -> None:
    task = apply_recipe(load_task(_task_yaml(tmp_path / "t.yaml", input="images")), n_train=2)
    assert task.model.preset == "vit-2d"
    model = build_model(task.model.preset, in_dim=3, num_classes=2, attention=task.model.attention)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_values_written_in_the_task_win_over_the_recipe(tmp_path: Path) -> None:
    task = load_task(_task_yaml(
        tmp_path / "t.yaml", model={"preset": "abmil", "overrides": {"dropout": 0.0, **TINY_ABMIL}},
        optimizer={"lr": 3e-3, "warmup_epochs": 0}, augment={"tile_fraction": [1.0, 1.0]},
        selection={"average_weights": False}, epochs=7,
    ))  # fmt: skip
    r = apply_recipe(task, n_train=40)
    assert (r.model.preset, r.model.attention) == ("abmil", "gated")  # the preset's own attention
    assert r.model.overrides == {"dropout": 0.0, "attention_dropout": 0.1, **TINY_ABMIL}
    assert (r.optimizer.lr, r.optimizer.warmup_epochs, r.epochs) == (3e-3, 0, 7)
    assert r.optimizer.weight_decay == RECIPES["small-cohort"].weight_decay  # not given: the recipe's
    assert r.augment.tile_fraction == (1.0, 1.0) and r.selection.average_weights is False
    assert r.selection.metric == "smoothed-val-loss"


def test_nsclc_subtype_keeps_the_papers_recipe() -> None:
    task = load_task("nsclc-subtype")
    assert task.recipe == "paper"
    r = apply_recipe(task, n_train=50)  # even on few cases: the paper's preset, whole bags
    assert (r.model.preset, r.model.attention, r.model.overrides) == ("vit-wsi", "seqnorm", {})
    assert (r.optimizer.lr, r.optimizer.weight_decay, r.optimizer.schedule, r.optimizer.warmup_epochs) == (
        1e-4, 1e-2, "none", 0,
    )  # fmt: skip
    assert (r.epochs, r.patience) == (100, 10)
    assert (r.augment.tile_fraction, r.augment.feature_dropout) == ((1.0, 1.0), 0.0)
    assert BagAugment.of(r) is None  # the loop feeds whole bags, unchanged
    assert Selection.of(r) == Selection("val-figure", 1, False)
    with torch.device("meta"):  # the paper's model: class-token readout, no LayerScale
        model = build_model(r.model.preset, attention=r.model.attention, **r.model.overrides)
    assert (model.config.pool, model.config.attn_layer_scale, model.pool) == ("cls", None, None)
    assert isinstance(model.norm, torch.nn.LayerNorm)
    assert all(blk.attn_scale is None for blk in model.transformer.blocks)


def test_the_small_cohort_preset_pools_tile_tokens_with_layer_scale() -> None:
    """What a task naming only its classes trains below 300 cases (docs/benchmarks.md, small-cohort MIL):
    gated attention pooling over the tile tokens (the final LayerNorm on the pooled vector, not on each
    token), and a LayerScale of 0.01 on
    the attention residual, one block of width 128 with the recipe's dropout."""
    task = apply_recipe(parse_task({"name": "t", "classes": list(CLASSES)}, source="test"), n_train=80)
    with torch.device("meta"):
        model = build_model(
            task.model.preset, attention=task.model.attention, in_dim=166, **task.model.overrides
        )
    cfg = model.config
    assert (cfg.pool, cfg.pool_dim, cfg.attn_layer_scale, cfg.depth, cfg.dim) == ("gated", 64, 0.01, 1, 128)
    assert cfg.dropout == RECIPES["small-cohort"].model_overrides["mil"]["dropout"]
    assert isinstance(model.norm, torch.nn.LayerNorm) and model.pool is not None
    assert model.transformer.blocks[0].attn_scale is not None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"augment": {"tile_fraction": [0.0, 1.0]}}, "tile_fraction"),
        ({"augment": {"tile_fraction": [0.9, 0.5]}}, "tile_fraction"),
        ({"augment": {"feature_dropout": 1.0}}, "feature_dropout"),
        ({"selection": {"window": 0}}, "selection.window"),
        ({"selection": {"metric": "auroc"}}, "metric"),
        ({"recipe": "tiny"}, "recipe"),
        ({"optimizer": {"warmup_epochs": -1}}, "warmup_epochs"),
    ],
)
def test_bad_recipe_fields_are_refused(tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_task(_task_yaml(tmp_path / "t.yaml", **fields))


# ------------------------------------------------------------------------------------ tile subsets
def _padded_batch(lengths: list[int]) -> Batch:
    g = torch.Generator().manual_seed(0)
    n = max(lengths)
    x = torch.zeros(len(lengths), n, 4)
    coords = torch.zeros(len(lengths), n, 2)
    mask = torch.zeros(len(lengths), n, dtype=torch.bool)
    for i, k in enumerate(lengths):
        x[i, :k] = torch.randn(k, 4, generator=g) + 10 * (i + 1)
        coords[i, :k] = torch.arange(k, dtype=torch.float32)[:, None].expand(k, 2) * 256
        mask[i, :k] = True
    return Batch(x=x, labels=torch.arange(len(lengths)), ids=[str(k) for k in lengths],
                 mask=mask, coords_um=coords)  # fmt: skip


def test_tile_subset_keeps_a_share_of_each_bag_in_order_with_its_coordinates() -> None:
    torch.manual_seed(0)
    lengths = [1, 2, 40, 9, 100]
    batch = _padded_batch(lengths)
    shrunk = set()
    for _ in range(20):
        out = tile_subset(batch, (0.5, 1.0))
        mask = out.mask
        for i, n in enumerate(lengths):
            kept = int(mask[i].sum())
            # a share in [0.5, 1], but at least MIN_SUBSET_TILES: bags of up to 16 tiles stay whole
            assert max(min(n, MIN_SUBSET_TILES), round(0.5 * n)) <= kept <= n
            shrunk |= {n} if kept < n else set()
            rows = (out.coords_um[i, :kept, 0] / 256).long()  # which tiles were kept
            assert torch.all(rows[1:] > rows[:-1])  # original order
            torch.testing.assert_close(out.x[i, :kept], batch.x[i, rows])  # features follow coordinates
            assert torch.all(out.x[i, kept:] == 0) and not mask[i, kept:].any()
        assert out.ids == batch.ids and torch.equal(out.labels, batch.labels)
    assert shrunk == {40, 100}  # the large bags were thinned, the small ones never
    small = _padded_batch([3, 16, 9])
    assert tile_subset(small, (0.5, 0.5)) is small  # nothing to drop: the batch as it was
    single = Batch(x=torch.randn(1, 1, 4), labels=torch.zeros(1, dtype=torch.long), ids=["a"])
    assert tile_subset(single, (0.5, 0.5)).x.shape == (1, 1, 4)  # a 1-tile bag keeps its tile
    assert tile_subset(batch, (1.0, 1.0)) is batch


def test_feature_dropout_zeroes_features_and_rescales_the_rest() -> None:
    torch.manual_seed(0)
    batch = Batch(x=torch.ones(1, 500, 8), labels=torch.zeros(1, dtype=torch.long), ids=["a"])
    out = BagAugment((1.0, 1.0), 0.2)(batch)
    values = set(out.x.unique().tolist())
    assert values == {0.0, 1.25} and 0.15 < float((out.x == 0).float().mean()) < 0.25


def test_augmentation_is_off_at_validation_and_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward hook records every bag the models see: validation and the test split get exactly the
    bags as stored (every tile, no dropout); training gets subsets. A task naming only its classes."""
    from wsi.pipelines.train import folds

    cohort = make_cohort(tmp_path / "c", n_patients=16)
    stored = {}
    for slide in cohort.slides:
        feats = read_bag(cohort.bags / f"{slide}.h5").feats
        stored[(feats.shape[0], round(float(feats.astype(np.float64).sum()), 3))] = slide
    seen: list[tuple[bool, int, tuple[int, float] | None]] = []

    def record(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0][0]  # (N, D) of a batch of one bag
        key = (x.shape[0], round(float(x.double().sum()), 3))
        seen.append((module.training, x.shape[0], key if key in stored else None))

    begin = folds.StartState.begin

    def begin_with_hook(self: folds.StartState) -> torch.nn.Module:
        model = begin(self)
        model.register_forward_pre_hook(record, with_kwargs=True)
        return model

    monkeypatch.setattr(folds.StartState, "begin", begin_with_hook)
    result = train(
        task=_task_yaml(tmp_path / "t.yaml", epochs=3), labels_csv=cohort.labels,
        features_dir=cohort.bags, out_dir=tmp_path / "run", progress=False,
    )  # fmt: skip
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["task"]["recipe"] == "small-cohort"
    assert config["task"]["augment"]["tile_fraction"] == list(RECIPES["small-cohort"].tile_fraction)
    evaluated = [key for training, _, key in seen if not training]
    trained = [(n, key) for training, n, key in seen if training]
    splits = list(csv.DictReader((result.run_dir / "splits.csv").open()))
    val = [r["slide"] for r in splits if r["split"] == "val"]
    test = [r["slide"] for r in splits if r["split"] == "test"]
    assert None not in evaluated  # every validation / test bag reached the model exactly as stored
    assert sorted(stored[k] for k in evaluated if k) == sorted(val * 3 + test)  # 3 epochs, then test
    assert len(trained) == 3 * sum(r["split"] == "train" for r in splits)
    assert sum(key is None for _, key in trained) > 0.9 * len(trained)  # training bags were changed


# ------------------------------------------------------------------- selection and weight averaging
def test_smoothed_loss_and_the_weights_it_keeps(tmp_path: Path) -> None:
    assert smoothed_loss([1.0, 0.2, 0.4, 0.6], 3) == pytest.approx(0.4)
    assert smoothed_loss([0.5], 5) == 0.5
    sel = Selection("smoothed-val-loss", 3, True)
    log = [{"val_loss": v} for v in (0.9, 0.5)]
    assert sel.score(log, {"val_loss": 0.4}, (0.8, -0.4)) == (pytest.approx(-0.6), 0.8)
    model = torch.nn.Linear(2, 1)
    for epoch in range(1, 5):
        with torch.no_grad():
            model.weight.fill_(float(epoch))
        sel.remember(model, tmp_path, epoch)
    sel.save_best(model, tmp_path / "best.safetensors", 4)
    best = load_file(tmp_path / "best.safetensors")
    torch.testing.assert_close(best["weight"], torch.full((1, 2), 3.0))  # mean of epochs 2, 3, 4
    assert len(list((tmp_path / "window").iterdir())) == 3  # older epochs dropped
    sel.finish(tmp_path)
    assert not (tmp_path / "window").exists()


# -------------------------------------------------------------------------- ABMIL through the pipeline
def test_abmil_trains_with_cross_validation_and_predicts_heatmaps_of_its_attention(tmp_path: Path) -> None:
    """`model: {preset: abmil}` in a task YAML: cross-validated training, checkpoints, prediction and
    heatmaps; the heatmap of a tile is its attention weight times its own class-score difference."""
    cohort = make_cohort(tmp_path / "c", n_patients=16)
    rng = np.random.default_rng(5)
    for i, n in enumerate((1, 2)):  # tiny bags among them
        make_bag(cohort.bags / f"tiny-{i}.h5", label=i % 2, rng=rng, n=n)
    task = _task_yaml(tmp_path / "t.yaml", model={"preset": "abmil", "overrides": TINY_ABMIL},
                      optimizer={"lr": 5e-3}, epochs=8)  # fmt: skip
    result = train(task=task, labels_csv=cohort.labels, features_dir=cohort.bags, out_dir=tmp_path / "run",
                   cv=2, progress=False)  # fmt: skip
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["model"]["kind"] == "abmil" and config["model"]["in_dim"] == IN_DIM
    assert config["task"]["model"]["attention"] == "gated"
    assert result.metrics["folds"] == 2 and result.metrics["auroc"]["mean"] > 0.8
    out = tmp_path / "pred"
    pred = predict(model_dir=result.run_dir, features_dir=cohort.bags, out_dir=out, progress=False)
    rows = {r["slide"]: r for r in pred.rows}
    assert len(rows) == len(cohort.slides) + 2 and not pred.failed
    for slide, row in rows.items():
        assert np.isfinite([float(row[f"prob_{c}"]) for c in CLASSES]).all()
        assert (out / "heatmaps" / f"{slide}.png").is_file()
    # the heatmap values predict draws, against the attention weights computed here
    run = load_run(result.run_dir, device="cpu")
    bag = read_bag(cohort.bags / f"{cohort.slides[0]}.h5")
    x = torch.from_numpy(bag.feats).float()[None]  # stored as float16
    extra = {"coords_um": torch.from_numpy(bag.coords_um)[None]}
    output = run.outputs(x, extra)[0].numpy()
    heatmaps, _ = run.explain(x, extra, output)
    predicted = int(output.argmax())
    expected = []
    for model in run.models:
        with torch.no_grad():
            a = model.attention_weights(x)[0]  # (N,) sums to one
            h = model.embed(x)[0]  # (N, hidden) tile embeddings (eval: no dropout)
            scores = h @ model.head.weight.T  # (N, C) each tile's own class scores
        torch.testing.assert_close(a.sum(), torch.tensor(1.0))
        expected.append(a * (scores[:, predicted] - scores[:, 1 - predicted]))  # (N,) two classes
    want = torch.stack(expected).mean(0).numpy()  # mean over the folds' models
    np.testing.assert_allclose(heatmaps[0][1], want, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------- the line a run starts with
def test_the_recipe_line_says_what_trains_in_words(tmp_path: Path) -> None:
    """The run's first line names the model, how much of each bag a step sees and which weights are
    kept, in words (not "tile share [1.0, 1.0], selection val-figure")."""
    from wsi.pipelines.train.recipe import describe_recipe

    task = load_task(_task_yaml(tmp_path / "t.yaml"))
    small = describe_recipe(apply_recipe(task, n_train=12), 12)
    assert small.startswith("training recipe 'small-cohort' for 12 training cases: model vit-wsi-small")
    assert "a random 50%-100% of each bag's tiles at every step" in small
    assert "weights averaged over the 5 epochs of lowest mean validation loss" in small
    paper = apply_recipe(task.replace(recipe="paper"), n_train=1)
    line = describe_recipe(paper, 1)
    assert "for 1 training case:" in line and "whole bags at every step" in line
    assert "adamw at learning rate 0.0001" in line and "each training bag once per epoch" in line
    assert "up to 100 epochs (stopping after 10 without improvement)" in line
    assert line.endswith("keeps the epoch of best validation AUROC")
    for jargon in ("tile share", "val-figure", "selection", "[1.0, 1.0]"):
        assert jargon not in small + line


def test_old_task_and_recipe_files_saying_scheduler_load_as_schedule(tmp_path: Path) -> None:
    """`optimizer.scheduler` (a task YAML, a dotted override) and a recipe's `scheduler` are the learning-
    rate schedule's earlier name (`--scheduler` is a Dask address): files written with it still load."""
    from wsi.core.config import parse_config, replace_config
    from wsi.pipelines.train.recipe import RecipeValues

    old = yaml.safe_load(write_task(tmp_path / "new.yaml").read_text())
    old["optimizer"] = {"lr": 2.0e-3, "scheduler": "cosine-epochs"}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    task = load_task(tmp_path / "old.yaml")
    assert task.optimizer.schedule == "cosine-epochs"
    assert replace_config(task, {"optimizer.scheduler": "none"}, source="t").optimizer.schedule == "none"
    old["optimizer"]["schedule"] = "cosine"  # both names: which one was meant is not known
    (tmp_path / "both.yaml").write_text(yaml.safe_dump(old))
    with pytest.raises(ConfigError, match="'scheduler' is the old name of 'schedule'"):
        load_task(tmp_path / "both.yaml")
    values = {"epochs": 5, "patience": 1, "lr": 1e-4, "weight_decay": 0.0, "scheduler": "multistep"}
    assert parse_config(RecipeValues, values, source="old recipe").schedule == "multistep"

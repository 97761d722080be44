"""The authors' recipes (configs/recipes/, `recipe: authors`) and the model settings a task gives a preset.

Each recipe file against its authors' values; the optimizers, schedules, sampling and checkpoint rules
they need against the authors' own code (tests/helpers/mil_baselines_reference.py: TransMIL's RAdam and
Lookahead, CLAM's weighted sampler, DSMIL's score, DTFD-MIL's window, torch's schedulers); every preset
against every packaged task (a task's model settings apply to the presets that take them; a run's
option a preset cannot take is refused naming the option and the preset).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from mil_training_reference import RefLookahead, RefRAdam, ref_add_weight_decay
from sklearn.metrics import roc_auc_score, roc_curve

from wsi.configs import available
from wsi.core.config import parse_config
from wsi.core.errors import ConfigError
from wsi.models import build_model
from wsi.models.base.kinds import MODEL_KINDS
from wsi.models.presets import load_preset, preset_kind
from wsi.pipelines.study.tasks import TaskConfig, load_task
from wsi.pipelines.train.config import TrainOptions
from wsi.pipelines.train.folds import model_kwargs
from wsi.pipelines.train.optim import decay_groups, make_optimizer, make_scheduler
from wsi.pipelines.train.preflight import refuse_model_for_input, refuse_model_for_kind
from wsi.pipelines.train.recipe import apply_recipe, authors_presets, authors_recipe
from wsi.pipelines.train.selection import Selection, auroc_plus_accuracy

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BASELINES = ("transmil", "clam-sb", "clam-mb", "dsmil", "dtfd")


def _authors(preset: str, task: str = "nsclc-subtype") -> TaskConfig:
    """The packaged task trained with `--preset P --recipe authors` (the options' changes, resolved)."""
    base = load_task(task)
    options = TrainOptions(preset=preset, recipe="authors")
    return apply_recipe(base.replace(**options.task_changes(base.model.overrides)), n_train=40)


# ------------------------------------------------------------------------------------ the recipe files
def test_every_baseline_has_an_authors_recipe_citing_its_repository() -> None:
    assert authors_presets() == sorted(BASELINES)
    for preset in BASELINES:
        values = authors_recipe(preset)
        assert "@" in values.source and values.source.split(" @ ")[1][:12].isalnum()
        assert values.tile_fraction == (1.0, 1.0) and values.feature_dropout == 0.0  # whole bags


@pytest.mark.parametrize(
    ("preset", "want"),
    [
        ("transmil", {"optimizer.name": "lookahead-radam", "optimizer.lr": 2e-4,
                      "optimizer.weight_decay": 1e-5, "optimizer.weight_decay_on": "not-1d",
                      "optimizer.schedule": "none", "grad_accum": 2, "epochs": 200, "patience": 10,
                      "selection.metric": "smoothed-val-loss",
                      "selection.window": 1, "sampling": "shuffle"}),
        ("clam-sb", {"optimizer.name": "adam", "optimizer.lr": 2e-4, "optimizer.weight_decay": 1e-5,
                     "optimizer.weight_decay_on": "all", "epochs": 200, "patience": 20, "min_epochs": 52,
                     "selection.metric": "smoothed-val-loss", "sampling": "balanced", "grad_accum": 1}),
        ("dsmil", {"optimizer.name": "adam", "optimizer.lr": 1e-4, "optimizer.betas": (0.5, 0.9),
                   "optimizer.weight_decay": 1e-3, "optimizer.schedule": "cosine-epochs",
                   "optimizer.min_lr": 5e-6, "epochs": 50, "patience": 11,
                   "selection.metric": "auroc-plus-accuracy"}),
        ("dtfd", {"optimizer.name": "adam", "optimizer.lr": 1e-4, "optimizer.weight_decay": 1e-4,
                  "optimizer.schedule": "multistep", "optimizer.milestones": (100,), "optimizer.gamma": 0.2,
                  "epochs": 200, "patience": 0, "selection.metric": "val-figure",
                  "selection.after_share": 0.8}),
    ],
)  # fmt: skip
def test_recipe_authors_fills_the_authors_values(preset: str, want: dict[str, Any]) -> None:
    """`--preset P --recipe authors` on the packaged nsclc-subtype: its own training settings (AdamW 1e-4,
    ...) give way to the authors' (the CLI's --recipe replaces them)."""
    task = _authors(preset)
    assert task.recipe == "authors"
    for key, value in want.items():
        node: Any = task
        for part in key.split("."):
            node = getattr(node, part)
        assert node == value, key
    assert task.augment.tile_fraction == (1.0, 1.0) and task.augment.feature_dropout == 0.0


def test_recipe_authors_sets_the_authors_model_settings() -> None:
    assert _authors("transmil").model.overrides["nystrom_version"] == "0.0.9"
    clam = _authors("clam-sb").model.overrides
    assert clam["inst_loss"] == "svm" and clam["subtyping"] is True  # the recipe's, and the task's own
    assert _authors("dsmil").model.scoring == "sigmoid"
    assert _authors("dtfd").model.overrides["grad_clip"] == 5.0


def test_recipe_authors_refuses_a_preset_without_one_and_a_task_naming_none() -> None:
    with pytest.raises(ConfigError, match=r"preset abmil has no authors' recipe .* clam-mb, clam-sb"):
        _authors("abmil")
    task = TaskConfig(name="t", classes=("a", "b"), recipe="authors")
    with pytest.raises(ConfigError, match=r"name its preset \(--preset clam-mb \| clam-sb"):
        apply_recipe(task, n_train=20)


def test_a_task_value_still_wins_over_the_recipe_it_names() -> None:
    task = TaskConfig(name="t", classes=("a", "b"), recipe="authors").replace(
        **{"model.preset": "dsmil", "optimizer.lr": 3e-4, "epochs": 7}
    )
    resolved = apply_recipe(task, n_train=20)
    assert resolved.optimizer.lr == 3e-4 and resolved.epochs == 7 and resolved.optimizer.name == "adam"


# -------------------------------------------------------------------------------- optimizer, schedule
class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cls_token = torch.nn.Parameter(torch.randn(1, 1, 4))
        self.fc = torch.nn.Linear(4, 3)
        self.norm = torch.nn.LayerNorm(3)
        self.head = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.fc(x + self.cls_token[0])))[..., 0]


def test_lookahead_radam_equals_transmils_optimizer_over_many_steps() -> None:
    """make_optimizer(lookahead-radam, not-1d) against MyOptimizer's RAdam in Lookahead on
    add_weight_decay's groups: 20 steps (RAdam's SGD phase, its rectified phase, three slow-weight
    synchronisations), and the class token decays as timm's rule has it."""
    torch.manual_seed(0)
    ours_model, ref_model = _Tiny(), _Tiny()
    ref_model.load_state_dict(ours_model.state_dict())
    task = TaskConfig(name="t", classes=("a", "b")).replace(**{
        "optimizer.name": "lookahead-radam", "optimizer.lr": 0.05, "optimizer.weight_decay": 0.1,
        "optimizer.weight_decay_on": "not-1d",
    })  # fmt: skip
    ours = make_optimizer(ours_model, task)
    ref = RefLookahead(RefRAdam(ref_add_weight_decay(ref_model, 0.1), lr=0.05))
    decayed = {n for g in decay_groups(ours_model, 0.1, "not-1d") if g["weight_decay"] for n in g["names"]}
    assert decayed == {"cls_token", "fc.weight", "head.weight"}
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        x = torch.randn(5, 4, generator=g)
        for model, opt in ((ours_model, ours), (ref_model, ref)):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    for (name, a), b in zip(ours_model.named_parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    assert "slow_buffer" in ours.state_dict()["state"][0]  # resumable: the slow weights are its state


def test_adam_all_decays_every_parameter_as_torch_adam_does() -> None:
    torch.manual_seed(0)
    model = _Tiny()
    task = TaskConfig(name="t", classes=("a", "b")).replace(**{
        "optimizer.name": "adam", "optimizer.lr": 1e-3, "optimizer.weight_decay": 1e-3,
        "optimizer.weight_decay_on": "all", "optimizer.betas": [0.5, 0.9],
    })  # fmt: skip
    opt = make_optimizer(model, task)
    assert isinstance(opt, torch.optim.Adam) and not isinstance(opt, torch.optim.AdamW)
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-3] and opt.defaults["betas"] == (0.5, 0.9)
    assert len(opt.param_groups[0]["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("scheduler", ["cosine-epochs", "multistep"])
def test_epoch_schedules_equal_torchs_schedulers_stepped_per_epoch(scheduler: str) -> None:
    """DSMIL's CosineAnnealingLR(opt, 50, 5e-6) and DTFD-MIL's MultiStepLR([100], 0.2), stepped once per
    epoch by the authors, here stepped per optimizer step (3 per epoch) and constant within an epoch."""
    epochs, steps = (50, 3) if scheduler == "cosine-epochs" else (200, 3)
    task = TaskConfig(name="t", classes=("a", "b")).replace(**{
        "optimizer.lr": 1e-4, "optimizer.schedule": scheduler, "optimizer.min_lr": 5e-6,
        "optimizer.milestones": [100], "optimizer.gamma": 0.2, "epochs": epochs,
    })  # fmt: skip
    p = torch.nn.Parameter(torch.zeros(1))
    ours_opt, ref_opt = torch.optim.Adam([p], lr=1e-4), torch.optim.Adam([p], lr=1e-4)
    ours = make_scheduler(ours_opt, task, steps)
    ref: Any = (
        torch.optim.lr_scheduler.CosineAnnealingLR(ref_opt, epochs, 5e-6)
        if scheduler == "cosine-epochs" else torch.optim.lr_scheduler.MultiStepLR(ref_opt, [100], 0.2)
    )  # fmt: skip
    assert ours is not None
    for _ in range(epochs):
        lrs = []
        for _ in range(steps):
            lrs.append(ours_opt.param_groups[0]["lr"])
            ours_opt.step()
            ours.step()
        assert lrs == pytest.approx([ref_opt.param_groups[0]["lr"]] * steps, rel=1e-9)
        ref_opt.step()
        ref.step()


# ------------------------------------------------------------------------------ sampling, checkpoints
def test_balanced_sampling_draws_each_class_equally_often() -> None:
    """CLAM's WeightedRandomSampler(N / n_class): with 4 of one class to 16 of the other, each epoch
    draws 20 cases with replacement, half of each class on average; shuffle sees each case once."""
    from wsi.pipelines.inputs import Item
    from wsi.pipelines.study.cases import _balanced_sampler

    items = [Item(id=f"s{i}", path=None, label=int(i < 4), patient=f"p{i}") for i in range(20)]  # type: ignore[arg-type]
    sampler = _balanced_sampler(items, torch.Generator().manual_seed(0))
    drawn = Counter(items[i].label for _ in range(200) for i in sampler)
    assert len(list(sampler)) == 20
    assert abs(drawn[1] / sum(drawn.values()) - 0.5) < 0.03


def _dsmil_score(labels: np.ndarray, p: np.ndarray) -> float:
    """train_tcga.py test + multi_label_roc + optimal_thresh + get_current_score, one output."""
    fpr, tpr, thr = roc_curve(labels, p, pos_label=1)
    t = thr[np.argmin(fpr - tpr)]
    return (roc_auc_score(labels, p) + float(np.mean((p >= t).astype(int) == labels))) / 2


def test_auroc_plus_accuracy_is_dsmils_score() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 30)
    p = np.clip(labels * 0.3 + rng.random(30) * 0.7, 0, 1)
    got = auroc_plus_accuracy(labels, np.stack([1 - p, p], 1), n_outputs=1)
    assert got == pytest.approx(_dsmil_score(labels, p))
    three = rng.random((30, 3))
    y3 = rng.integers(0, 3, 30)
    want_auc = sum(roc_auc_score(y3 == c, three[:, c]) for c in range(3))
    assert auroc_plus_accuracy(y3, three, n_outputs=3) >= want_auc / 2  # exact-match accuracy >= 0


def test_dtfd_window_and_clam_minimum_epochs() -> None:
    """DTFD-MIL keeps epochs ii > int(0.8 * 200) (0-based): 162-200 here; CLAM stops no earlier than 52."""
    s = Selection(metric="val-figure", after_share=0.8)
    eligible = [e for e in range(1, 201) if s.eligible(e, 200)]
    assert eligible[0] == 162 and eligible[-1] == 200 and len(eligible) == 39
    assert Selection().eligible(1, 200) and Selection(after_share=0.8).eligible(3, 3)  # the last epoch


# ---------------------------------------------------------------------- every preset, every packaged task
@pytest.mark.parametrize("task_name", available("tasks"))
def test_every_preset_resolves_on_every_packaged_task_or_is_refused_by_name(task_name: str) -> None:
    """A task's model settings (attention, overrides) reach the presets that take them; a preset that
    cannot read the task's input or learn its kind is refused naming the preset; every other pair gives
    a model config the preset's model kind accepts (no 'unknown field' blaming the preset file)."""
    base = load_task(task_name)
    for preset in available("models"):
        task = base.replace(**{"model.preset": preset})
        try:
            refuse_model_for_kind(task)
            refuse_model_for_input(task)
        except ConfigError as exc:
            assert f"model {preset}" in str(exc) and "configs/models" not in str(exc)
            continue
        resolved = apply_recipe(task, n_train=40)
        kind = preset_kind(preset)
        kwargs = model_kwargs(resolved, 2, {})
        config = {**load_preset(preset).data, **{k: v for k, v in kwargs.items() if k != "preset"}}
        if config.get("attention") is None:
            config.pop("attention", None)
        parse_config(MODEL_KINDS.get(kind).config_class, config, source=f"{task_name} x {preset}")
        assert set(resolved.model.overrides) <= set(MODEL_KINDS.get(kind).config_class.__dataclass_fields__)


def test_the_subtyping_flag_reaches_clam_only() -> None:
    task = load_task("nsclc-subtype")
    assert task.model.overrides == {"subtyping": True}
    for preset, want in (("clam-sb", {"subtyping": True}), ("clam-mb", {"subtyping": True}), ("vit-wsi", {})):
        assert apply_recipe(task.replace(**{"model.preset": preset}), n_train=40).model.overrides == want
    model = build_model("clam-sb", in_dim=8, **apply_recipe(task.replace(**{"model.preset": "clam-sb"}),
                                                           n_train=40).model.overrides)  # fmt: skip
    assert model.config.is_subtyping


def test_an_attention_goes_only_where_its_value_is_one_of_the_presets() -> None:
    """A task written for ABMIL (attention: gated) trained with vit-wsi keeps vit-wsi's own attention;
    nsclc-subtype's seqnorm trained with ABMIL keeps ABMIL's gated."""
    task = load_task("nsclc-subtype")
    gated = task.replace(**{"model.attention": "gated", "model.preset": "vit-wsi"})
    assert apply_recipe(gated, n_train=40).model.attention == "seqnorm"
    assert apply_recipe(task.replace(**{"model.preset": "abmil"}), n_train=40).model.attention == "gated"
    softmax = task.replace(**{"model.attention": "softmax", "model.preset": "vit-wsi-small"})
    assert apply_recipe(softmax, n_train=40).model.attention == "softmax"


def test_a_run_option_the_preset_cannot_take_is_refused_naming_option_and_preset() -> None:
    task = load_task("nsclc-subtype").replace(**{"model.preset": "dsmil", "model.attention": "gdla"})
    options = TrainOptions(preset="dsmil", attention="gdla")
    with pytest.raises(ConfigError) as exc:
        apply_recipe(task, n_train=40, given=options.given_model_settings())
    message = str(exc.value)
    assert "--attention 'gdla'" in message and "preset dsmil" in message and "configs/" not in message
    overrides = TrainOptions(model_overrides={"depth": 1}).given_model_settings()
    with pytest.raises(ConfigError, match=r"model_overrides.depth 1: preset clam-sb"):
        apply_recipe(task.replace(**{"model.preset": "clam-sb"}), n_train=40, given=overrides)
    kept = apply_recipe(task, n_train=40)  # the task's own attention: left out for dsmil, not refused
    assert kept.model.attention is None and kept.model.scoring == "sigmoid"


def test_old_run_records_rebuild_as_they_trained() -> None:
    """A CLAM saved with subtyping auto/on/off and a DSMIL saved before scoring existed."""
    from wsi.models.presets import build_model_from_config

    clam = {**load_preset("clam-sb").data, "in_dim": 8, "num_classes": 3, "subtyping": "auto"}
    clam.pop("inst_loss")
    assert build_model_from_config(clam, saved=True).config.subtyping is True
    assert build_model_from_config({**clam, "subtyping": "off"}, saved=True).config.subtyping is False
    old = {k: v for k, v in load_preset("dsmil").data.items() if k != "scoring"}
    assert build_model_from_config({**old, "in_dim": 8}, saved=True).config.scoring == "softmax"


def test_lookahead_radam_resumes_where_it_stopped(tmp_path: Path) -> None:
    """The slow weights and the Lookahead counter are saved in resume/ and restored: 7 steps, a resume,
    8 more give the weights of 15 uninterrupted steps (two synchronisations on either side)."""
    from wsi.pipelines.train.state import TrainState, load_resume, save_resume

    task = TaskConfig(name="t", classes=("a", "b")).replace(**{
        "optimizer.name": "lookahead-radam", "optimizer.lr": 0.05, "optimizer.weight_decay": 0.1,
        "optimizer.weight_decay_on": "not-1d",
    })  # fmt: skip
    x = torch.randn(15, 5, 4, generator=torch.Generator().manual_seed(2))

    def steps(model: torch.nn.Module, opt: torch.optim.Optimizer, batches: torch.Tensor) -> None:
        for xb in batches:
            opt.zero_grad()
            model(xb).pow(2).mean().backward()
            opt.step()

    torch.manual_seed(0)
    whole = _Tiny()
    start = {k: v.clone() for k, v in whole.state_dict().items()}
    steps(whole, make_optimizer(whole, task), x)
    first = _Tiny()
    first.load_state_dict(start)
    opt = make_optimizer(first, task)
    steps(first, opt, x[:7])
    save_resume(tmp_path, model=first, optimizer=opt, scheduler=None, loader_generator=torch.Generator(),
                state=TrainState(epoch=1))  # fmt: skip
    again = _Tiny()
    opt2 = make_optimizer(again, task)
    load_resume(tmp_path, model=again, optimizer=opt2, scheduler=None, loader_generator=torch.Generator())
    steps(again, opt2, x[7:])
    for (name, a), b in zip(again.named_parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)

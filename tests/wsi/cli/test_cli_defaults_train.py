"""`wsi train`, `wsi embed-slides` and `wsi demo` restate no default and no choice list: every setting is a
field of the command's config (TrainOptions, SlideEmbedOptions, DemoOptions), its choices a registry's,
and the library entry points take that config (plus a few arguments), not one keyword per setting."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from wsi.cli._options import ConfigOption, RegistryChoice, field_of
from wsi.cli.main import cli, load_command
from wsi.pipelines.demo.run import DemoOptions
from wsi.pipelines.embed_slides.config import SlideEmbedOptions
from wsi.pipelines.predict.config import PredictOptions
from wsi.pipelines.train.config import TrainOptions

CONFIGS = {"train": TrainOptions, "embed-slides": SlideEmbedOptions, "demo": DemoOptions}
# what a command is told besides its settings: where the task, labels, inputs and outputs are
WHERE = {"train": {"task", "labels_csv", "out_dir"}, "embed-slides": {"features", "out_dir"}, "demo": set()}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_setting_comes_from_the_config(name: str) -> None:
    command = load_command(name)
    plain = {
        p.name for p in command.params
        if isinstance(p, click.Option) and not isinstance(p, ConfigOption) and p.name != "help"
    }  # fmt: skip
    assert plain == WHERE[name], f"wsi {name}: options not built from {CONFIGS[name].__name__}"
    built = {p.path for p in command.params if isinstance(p, ConfigOption)}
    assert all(p.model is CONFIGS[name] for p in command.params if isinstance(p, ConfigOption))
    assert built, name
    for option in command.params:
        if isinstance(option, click.Option) and not isinstance(option, ConfigOption):
            assert (option.required or option.default is None) and not isinstance(option.type, click.Choice)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_defaults_and_help_are_the_fields(name: str) -> None:
    for option in load_command(name).params:
        if not isinstance(option, ConfigOption):
            continue
        f, _ = field_of(option.model, option.path)
        want = None if f.default is dataclasses.MISSING else f.default
        assert option.default == want, f"wsi {name} {option.opts[0]}: {option.default!r} != {want!r}"
        assert f.metadata["description"] in (option.help or "")


def test_choices_come_from_the_registries() -> None:
    from wsi.configs import available
    from wsi.models.attention import ATTENTION
    from wsi.models.slide_encoders import SLIDE_ENCODERS

    train = {p.name: p for p in load_command("train").params}
    attention = train["_cfg_attention"]
    assert isinstance(attention.type, RegistryChoice)
    assert list(attention.type.choices) == ATTENTION.names() and "gdla" in attention.type.choices
    assert all(preset in (train["_cfg_preset"].help or "") for preset in available("models"))
    encoder = {p.name: p for p in load_command("embed-slides").params}["_cfg_encoder"]
    assert isinstance(encoder.type, RegistryChoice) and list(encoder.type.choices) == SLIDE_ENCODERS.names()
    assert encoder.required  # a field with no default is a required option


def test_every_device_option_defaults_to_auto() -> None:
    """`--device` meant cpu in embed-slides and auto in train and predict; now auto in all three (wsi
    embed's None, "cuda when available", is its own config's)."""
    assert TrainOptions().device == SlideEmbedOptions(encoder="chief").device == PredictOptions().device
    for name in ("train", "embed-slides", "predict"):
        for p in load_command(name).params:
            if p.name and p.name.endswith("device"):
                assert p.default == "auto", f"wsi {name} --device defaults to {p.default!r}"


def test_stage_entry_points_take_a_config() -> None:
    from wsi.pipelines.embed_slides import embed_slides
    from wsi.pipelines.predict.stage import predict
    from wsi.pipelines.train import train

    for func, config in ((train, TrainOptions), (embed_slides, SlideEmbedOptions), (predict, PredictOptions)):
        params = inspect.signature(func).parameters
        named = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        assert params["options"].annotation in (f"{config.__name__} | None",), func
        assert len(named) <= 6, f"{func.__name__} takes {named}"


def _captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import wsi.pipelines.train as train_pkg

    seen: dict[str, Any] = {}

    def fake_train(task: str, **kwargs: Any) -> None:
        seen.update(task=task, **kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(train_pkg, "train", fake_train)
    return seen


def _base(tmp_path: Path) -> list[str]:
    labels, out = str(tmp_path / "l.csv"), str(tmp_path / "o")
    return ["train", "--task", "nsclc-subtype", "--labels", labels, "--out", out]


def test_train_options_arrive_as_one_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _captured(monkeypatch)
    base = _base(tmp_path)
    result = CliRunner().invoke(cli, base)
    assert result.exit_code == 0, result.output
    assert seen["options"] == TrainOptions()  # nothing given: the fields' defaults, the task's values
    assert seen["options"].task_changes({}) == {}
    args = ["--epochs", "3", "--seed", "7", "--bag-size", "64", "--preset", "abmil", "--attention", "sima",
            "--no-standardize-features", "--num-workers", "2", "--no-progress",
            "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(cli, [*base, *args])
    assert result.exit_code == 0, result.output
    opts = seen["options"]
    assert (opts.epochs, opts.seed, opts.bag_size, opts.progress, opts.device) == (3, 7, 64, False, "cpu")
    assert opts.task_changes({"dim": 32}) == {
        "model.preset": "abmil", "model.attention": "sima", "epochs": 3, "seed": 7,
        "input_options.bag_size": 64, "num_workers": 2, "standardize_features": False,
    }  # fmt: skip


def test_train_option_rules_are_usage_errors(tmp_path: Path) -> None:
    base = _base(tmp_path)
    result = CliRunner().invoke(cli, [*base, "--scheduler", "tcp://h:1"])
    assert result.exit_code == 2 and "give --cv K too" in result.output
    result = CliRunner().invoke(cli, [*base, "--attention", "nope"])
    assert result.exit_code == 2 and "'nope' is not one of" in result.output


def test_the_task_changes_go_through_the_task_checks() -> None:
    """A setting changes the task by the same route a YAML takes: its ranges and rules apply."""
    from wsi.core.errors import ConfigError
    from wsi.pipelines.study.tasks import load_task
    from wsi.pipelines.train.run import resolve_task

    task = resolve_task("nsclc-subtype", TrainOptions(epochs=2, model_overrides={"depth": 1}, bag_size=16))
    overrides = task.model.overrides  # merged over the task's own (nsclc-subtype: CLAM's subtyping flag)
    assert task.epochs == 2 and overrides == {"subtyping": True, "depth": 1}
    assert task.input_options["bag_size"] == 16
    kept = load_task("nsclc-subtype").replace(**{"model.overrides": {"dim": 8}})
    merged = resolve_task(kept, TrainOptions(model_overrides={"depth": 1}))
    assert merged.model.overrides == {"dim": 8, "depth": 1}
    with pytest.raises(ConfigError, match="epochs"):
        resolve_task("nsclc-subtype", TrainOptions(overrides={"epochs": 0}))
    with pytest.raises(ConfigError, match="unknown attention"):
        TrainOptions(attention="nope")


def test_demo_options_are_demo_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wsi.pipelines.demo.run as demo

    seen: dict[str, Any] = {}

    def fake(options: DemoOptions) -> None:
        seen["options"] = options
        raise SystemExit(0)

    monkeypatch.setattr(demo, "run_demo", fake)
    result = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert seen["options"] == DemoOptions(out_dir=tmp_path / "d")
    result = CliRunner().invoke(cli, ["demo", "--slides-per-class", "3"])
    assert result.exit_code == 2 and "--slides-per-class" in result.output

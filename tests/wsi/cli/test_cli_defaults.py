"""Every command-line default, range, choice list and help text comes from the config model that owns the
setting, or from the registry that names the choices; no option restates one (issue 30).

`test_no_option_restates_a_default_or_choices` walks the `wsi` group and every command in WALKED: each
option is a ConfigOption (built from a field: its default, choices and help compared with the field's), or a
plain option without a default or a choice list of its own, or listed in FROM_ELSEWHERE with the registry or
constant its value comes from (compared here). A plain `click.option("--port", default=8765)` fails.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

import click
import pytest
from click.testing import CliRunner

from wsi.cli._options import ConfigOption, config_options, field_of, model_default
from wsi.cli.main import COMMANDS, cli, load_command
from wsi.pipelines.embed.config import EmbedOptions
from wsi.pipelines.tile.config import SegmentationOptions
from wsi.tiling.params import ARTIFACT_FILTERS, TileParams

WALKED = sorted(COMMANDS)  # train, embed-slides and demo too: TrainOptions, SlideEmbedOptions, DemoOptions


def _segmenter_names(kind: Literal["tissue", "artifact"]) -> list[str]:
    from wsi.models.segmentation.named import segmenter_names

    return segmenter_names(kind)


# plain options whose default or choices come from somewhere other than a config field: (command, option
# name) -> (what is compared, where the value comes from)
FROM_ELSEWHERE: dict[tuple[str, str], tuple[str, Callable[[], Any]]] = {
    ("tile", "no_filter"): ("choices", lambda: list(ARTIFACT_FILTERS)),  # the weight-free filters' names
    ("embed", "encoders"): ("default", lambda: (model_default(EmbedOptions, "encoder"),)),  # paired by order
}
# config options whose choices are a registry's (the field's type names them; the registry must agree)
REGISTRY_CHOICES: dict[tuple[str, str], Callable[[], list[str]]] = {
    ("tile", "tissue_model"): lambda: _segmenter_names("tissue"),
    ("tile", "artifact_model"): lambda: _segmenter_names("artifact"),
}
# settings restated by hand before (issue 19): each must now come from its model, per command
OWNED = {
    "tile": {"tile_um", "tile_px", "min_tissue_fraction", "max_background_fraction", "white_level",
             "min_blur_variance", "tissue.thumb_mpp", "tissue.min_saturation", "mpp", "backend", "workers",
             "threads", "background", "save_tiles", "overwrite"},
    "embed": {"tile_um", "tile_px", "mpp", "precision", "batch_size", "readers", "reader_mode", "decode",
              "dtype", "max_bad_tiles", "use_cache", "device", "input_px", "stain_norm", "random_init"},
    "predict": {"weights", "mpp", "backend", "device", "workers", "labels_csv", "top_tiles", "heatmaps",
                "stream_above_tiles", "overwrite", "progress"},
    "info": {"backend"},
    "view": {"host", "port", "server_threads", "backend"},
    "make-slides": {"n", "size_um", "mpp", "styles", "texture", "seed", "prefix", "tile_px", "write_mpp"},
}  # fmt: skip
OWNED["tile"] |= {"tissue_model", "tissue_weights", "artifact_model", "artifact_weights",
                  "max_artifact_fraction", "device"}  # fmt: skip


# same name, another setting: embed's encoder list (paired by order, default from EmbedOptions, below);
# info's --mpp also gives a pixel-coordinate bag's resolution, which no tiling option means
OWN_MEANING = {("embed", "encoders"), ("embed", "weights"), ("embed", "expected_sha256"), ("info", "mpp")}


def _config_options(name: str) -> list[ConfigOption]:
    return [p for p in load_command(name).params if isinstance(p, ConfigOption)]


def _no_value(value: object) -> bool:
    """No default of the option's own: unset, None, or an empty repeatable option."""
    return value is None or value == () or repr(value) == "Sentinel.UNSET"


def _literal_values(hint: Any) -> list[str] | None:
    """The values a field's Literal type allows (Optional and tuple[..., ...] looked through)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return _literal_values(args[0])
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _literal_values(args[0])
    return [str(a) for a in typing.get_args(hint)] if typing.get_origin(hint) is Literal else None


def _restated(name: str, option: click.Option) -> str | None:
    """Why `option` of command `name` restates a value, or None."""
    where = f"wsi {name} {option.opts[0]}"
    choices = list(option.type.choices) if isinstance(option.type, click.Choice) else None
    if isinstance(option, ConfigOption):
        f, hint = field_of(option.model, option.path)
        expected = None if f.default is dataclasses.MISSING else model_default(option.model, option.path)
        if option.default != expected:
            return f"{where}: default {option.default!r}, field {expected!r}"
        named = f.metadata.get("json_schema_extra", {}).get("choices")  # a registry's, asked when used
        declared = list(named()) if named is not None else _literal_values(hint)
        if choices != declared:
            return f"{where}: choices {choices}, field {declared}"
        registry = REGISTRY_CHOICES.get((name, option.name or ""))
        if registry is not None and choices != registry():
            return f"{where}: choices {choices}, registry {registry()}"
        return None
    source = FROM_ELSEWHERE.get((name, option.name or ""))
    if source is not None:
        what, value = source
        got = option.default if what == "default" else choices
        return None if got == value() else f"{where}: {what} {got!r}, its source {value()!r}"
    if option.count and option.default == 0:
        return None  # -v: counted from nothing
    if (option.is_flag and option.default in (False, None)) or _no_value(option.default):
        return None if choices is None else f"{where}: a choice list written by hand {choices}"
    return f"{where}: default {option.default!r} written by hand"


@pytest.mark.parametrize("name", [None, *WALKED], ids=lambda n: n or "wsi")
def test_no_option_restates_a_default_or_choices(name: str | None) -> None:
    command = cli if name is None else load_command(name)
    options = [p for p in command.params if isinstance(p, click.Option)]
    problems = [why for o in options if (why := _restated(name or "", o)) is not None]
    assert not problems, "\n".join(problems)


def test_the_walk_catches_a_restated_default_and_choice_list() -> None:
    """The rule itself: options written by hand are caught, those built from a field pass."""
    @click.command()
    @click.option("--port", type=int, default=8765)
    @click.option("--texture", type=click.Choice(["procedural", "real"]))
    @click.option("--flag", is_flag=True)
    @config_options(SegmentationOptions, {"--tissue-model": "tissue_model", "--device": "device"}, into="s")
    def toy(port: int, texture: str, flag: bool, s: dict[str, Any]) -> None: ...

    found = {o.name: _restated("toy", o) for o in toy.params if isinstance(o, click.Option)}
    assert found["port"] is not None and "8765" in found["port"]
    assert found["texture"] is not None and "by hand" in found["texture"]
    assert found["flag"] is None and found["_cfg_tissue_model"] is None and found["_cfg_device"] is None


def test_segmentation_choices_are_the_registrys() -> None:
    """wsi tile offers exactly the registered networks of each kind (listed without importing torch: the
    names are wsi.tiling.params's types, which the registry checks itself against when imported)."""
    options = {o.name: o for o in load_command("tile").params}
    for option, kind in (("_cfg_tissue_model", "tissue"), ("_cfg_artifact_model", "artifact")):
        choice = options[option].type
        assert isinstance(choice, click.Choice) and list(choice.choices) == _segmenter_names(kind)


@pytest.mark.parametrize("name", WALKED)
def test_device_defaults_to_auto(name: str) -> None:
    for option in load_command(name).params:
        if option.name and option.name.removeprefix("_cfg_") == "device":
            assert option.default == "auto", f"wsi {name} --device defaults to {option.default!r}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_cli_default_equals_its_config_default(name: str) -> None:
    for option in _config_options(name):
        f, _ = field_of(option.model, option.path)
        expected = None if f.default is dataclasses.MISSING else model_default(option.model, option.path)
        assert option.default == expected, f"wsi {name} {option.opts[0]}: {option.default!r} != {expected!r}"
        assert f.metadata["description"] in (option.help or ""), f"wsi {name} {option.opts[0]}: help differs"


@pytest.mark.parametrize("name", sorted(OWNED))
def test_restated_settings_now_come_from_their_model(name: str) -> None:
    paths = {o.path for o in _config_options(name)}
    assert OWNED[name] <= paths, f"wsi {name} restates {sorted(OWNED[name] - paths)}"


def test_no_plain_option_shadows_a_config_field() -> None:
    """An option named like a field of a model its command uses must be built from that field."""
    for name in sorted(COMMANDS):
        command = load_command(name)
        used = {o.model for o in _config_options(name)}
        fields = {f.name for m in used for f in dataclasses.fields(m)}
        plain = [p for p in command.params if isinstance(p, click.Option) and not isinstance(p, ConfigOption)]
        for option in plain:
            if option.name in fields and (name, option.name) not in OWN_MEANING:
                pytest.fail(f"wsi {name} {option.opts[0]} restates {option.name} by hand")
    # the multi-encoder options of wsi embed take their default and help from EmbedOptions too
    encoder = next(p for p in load_command("embed").params if p.name == "encoders")
    assert encoder.default == (model_default(EmbedOptions, "encoder"),)


def test_ranges_are_the_models_own() -> None:
    """A value the model refuses is refused by the option (the old CLI refused --tile-um below 1 while
    TileParams took any positive value)."""
    runner = CliRunner()
    command = load_command("tile")
    for args, bad in ((["--tile-um", "0"], "--tile-um"), (["--min-tissue", "1.5"], "--min-tissue"),
                      (["--tile-px", "4"], "--tile-px"), (["--thumb-mpp", "0"], "--thumb-mpp")):  # fmt: skip
        result = runner.invoke(command, ["slide.svs", "--out", "out", *args])
        assert result.exit_code == 2 and bad in result.output, result.output
    assert TileParams(tile_um=1.0).tile_um == 1.0  # what the model takes, the CLI takes
    result = runner.invoke(command, ["missing.svs", "--out", "out", "--tile-um", "1"])
    assert "--tile-um" not in result.output


def test_options_arrive_as_one_nested_mapping() -> None:
    seen: dict[str, object] = {}

    @click.command()
    @config_options(TileParams, {"--tile-um": "tile_um", "--thumb-mpp": "tissue.thumb_mpp"}, into="tiling")
    @config_options(EmbedOptions, {"--readers": "readers", "--cache": "use_cache"}, into="embed")
    def toy(tiling: dict[str, object], embed: dict[str, object]) -> None:
        seen.update(tiling=tiling, embed=embed)

    result = CliRunner().invoke(toy, ["--thumb-mpp", "4", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert seen["tiling"] == {"tile_um": 256.0, "tissue": {"thumb_mpp": 4.0}}
    assert seen["embed"] == {"use_cache": False}  # readers: computed by the model when not given
    CliRunner().invoke(toy, ["--readers", "3"])
    assert seen["embed"] == {"readers": 3, "use_cache": True}


def test_a_setting_without_help_cannot_become_an_option() -> None:
    @dataclasses.dataclass(frozen=True)
    class Bare:
        x: int = 1

    with pytest.raises(TypeError, match="no help text"):
        config_options(Bare, {"--x": "x"}, into="bare")(lambda bare: None)

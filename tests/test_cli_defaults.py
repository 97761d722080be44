"""Every command-line default, range and help text comes from the config model that owns the setting."""

from __future__ import annotations

import dataclasses

import click
import pytest
from click.testing import CliRunner

from wsi.cli._options import ConfigOption, config_options, field_of, model_default
from wsi.cli.main import COMMANDS, load_command
from wsi.pipelines.embed.config import EmbedOptions
from wsi.pipelines.predict.config import PredictOptions
from wsi.pipelines.tile.config import TileOptions
from wsi.tile_params import TileParams

MODELS = (TileParams, TileOptions, EmbedOptions, PredictOptions)
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
}  # fmt: skip


# same name, another setting: embed's encoder list (paired by order, default from EmbedOptions, below);
# info's --mpp also gives a pixel-coordinate bag's resolution, which no tiling option means
OWN_MEANING = {("embed", "encoders"), ("embed", "weights"), ("embed", "expected_sha256"), ("info", "mpp")}


def _config_options(name: str) -> list[ConfigOption]:
    return [p for p in load_command(name).params if isinstance(p, ConfigOption)]


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

"""`wsi encoders`: the table a user picks from, one recipe in full, a YAML that rebuilds the same model."""

from __future__ import annotations

from pathlib import Path

import torch
from click.testing import CliRunner

from wsi.cli.main import cli
from wsi.models.encoders import ENCODERS, build_encoder


def test_table_lists_every_named_encoder_with_its_facts() -> None:
    result = CliRunner().invoke(cli, ["encoders"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines() if line.strip()}
    assert set(ENCODERS.names()) <= set(lines)
    assert lines["uni2-h"].split()[1:5] == ["1536", "224", "px", "681.4M"]
    assert "2560" in lines["virchow2"] and "631.2M" in lines["virchow2"]
    assert "256>224 px" in lines["prov-gigapath"] and "0.5" in lines["h-optimus-0"]
    assert "Apache-2.0" in lines["h-optimus-0"] and "CC-BY-NC-ND-4.0" in lines["uni"]


def test_one_recipe_and_unknown_names() -> None:
    result = CliRunner().invoke(cli, ["encoders", "conch-v1.5"])
    assert result.exit_code == 0
    assert "MahmoodLab/conchv1_5" in result.output and "--encoder conch-v1.5 --weights" in result.output
    bad = CliRunner().invoke(cli, ["encoders", "uni3"])
    assert bad.exit_code == 2 and "unknown encoder 'uni3'" in bad.output and "uni2-h" in bad.output
    assert "Examples" in CliRunner().invoke(cli, ["encoders", "--help"]).output


def test_yaml_of_a_recipe_rebuilds_the_same_encoder(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["encoders", "virchow2", "--yaml"])
    assert result.exit_code == 0
    path = tmp_path / "my-virchow.yaml"
    path.write_text(result.output)
    mine = build_encoder(str(path), random_init=True, arch_overrides={"depth": 1})
    named = build_encoder("virchow2", random_init=True, arch_overrides={"depth": 1})
    tiles = torch.randint(0, 256, (2, 256, 256, 3), dtype=torch.uint8)
    with torch.inference_mode():
        torch.testing.assert_close(mine.embed(tiles), named.embed(tiles))
    assert mine.encoder_id == "my-virchow-test" and mine.dim == 2560

"""`wsi encoders`: the named tile encoders, their recipes, and where their weights come from."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from wsi.cli._common import user_errors
from wsi.cli._weights import weights_lines, weights_state
from wsi.storage.hf import repo_of

if TYPE_CHECKING:
    from wsi.models.encoders import EncoderRecipe


@click.command(
    "encoders",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  wsi encoders                          # every named encoder: width, input, parameters, mpp, licence
  wsi encoders uni2-h                   # one recipe in full, where its weights come from, the command
  wsi encoders virchow2 --yaml > my.yaml   # a recipe as YAML: edit it into your own --encoder my.yaml
  wsi encoders --json                   # all recipes, machine-readable
  wsi encoders --slide                  # slide encoders: the tile encoder each needs, params, licence
  wsi encoders --slide chief            # one slide encoder: tiles, weights page, the authors' code

\b
Weights are never downloaded at run time. Models on the Hugging Face Hub are found in its cache (HF_HOME,
HF_HUB_CACHE, ~/.cache/huggingface/hub) after you accept the terms on their page and run `hf download`
once (the `weights` column: cached, or "-" not yet; `wsi encoders NAME` prints the command):
  hf download MahmoodLab/UNI2-h pytorch_model.bin
  wsi embed --tiles run/ --out run/ --encoder uni2-h                       # from the cache, offline
  wsi embed --tiles run/ --out run/ --encoder uni2-h --weights hf:MahmoodLab/UNI2-h
Or give the file or the model folder (RetCCL and CTransPath are not on the Hub):
  wsi embed --tiles run/ --out run/ --encoder uni --weights /models/UNI/pytorch_model.bin
  wsi embed --tiles run/ --out run/ --encoder phikon-v2 --weights /models/phikon-v2/
Tile at the encoder's training resolution (the mpp column): wsi tile slides/ --out run/ --mpp 0.5
""",
)
@click.argument("name", required=False)
@click.option(
    "--yaml", "as_yaml", is_flag=True, help="Print the recipe(s) as YAML (a template for your own)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the recipe(s) as JSON.")
@click.option(
    "--slide", "slide", is_flag=True,
    help="The slide encoders (wsi embed-slides): tile encoder each needs, parameters, licence, weights.",
)  # fmt: skip
@user_errors
def command(name: str | None, as_yaml: bool, as_json: bool, slide: bool) -> None:
    """List the named tile encoders (or with --slide the slide encoders), or show one."""
    if slide:
        from wsi.cli.slide_encoders import show_slide_encoders

        show_slide_encoders(name, as_json=as_json)
        return
    from wsi.models.encoders import ENCODERS, get_recipe

    names = [name] if name else ENCODERS.names()
    recipes = {n: get_recipe(n) for n in names}  # unknown NAME: a ConfigError listing the choices
    if as_json or as_yaml:
        data = {n: r.as_dict() for n, r in recipes.items()}
        if as_yaml:
            import yaml

            body = data[name] if name else data
            click.echo(yaml.safe_dump(body, sort_keys=False), nl=False)
        else:
            click.echo(json.dumps(data[name] if name else data, indent=2))
        return
    if name:
        _describe(name, recipes[name])
        return
    rows = [("name", "width", "input", "params", "mpp", "weights", "licence")]
    for n, r in recipes.items():
        resize = f"{r.resize_to}>" if r.resize_to != r.input_px else ""
        rows.append((n, str(r.dim), f"{resize}{r.input_px} px", _millions(r.params), f"{r.training_mpp:g}"
                     if r.training_mpp else "?", weights_state(repo_of(r.source), r.weights_files),
                     r.licence.split(" (")[0]))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    click.echo("\nAlso: --encoder timm:<architecture> (any timm model) or --encoder my-encoder.yaml.")
    click.echo("weights: cached = in the Hugging Face cache (used without --weights), - = not yet (`wsi "
               "encoders NAME` prints the download command), --weights = not on the Hub: give the file.")
    click.echo("`wsi encoders NAME` shows where a model's weights come from; --slide: slide encoders.")


def _millions(params: int | None) -> str:
    if not params:
        return "?"
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"


def _describe(name: str, r: EncoderRecipe) -> None:
    resize = (
        f"resize shorter side to {r.resize_to} px ({r.interpolation}), " if r.resize_to != r.input_px else ""
    )
    lines = [
        f"{name}: {r.arch}, {_millions(r.params)} parameters, {r.dim}-d features ({r.pooling} pooling)",
        f"  input:     {resize}{r.input_px} px ({r.interpolation}, centre crop); mean {r.mean}, std {r.std}",
        f"  arguments: {r.kwargs or '(the architecture defaults)'}",
        f"  trained:   {r.training_mpp:g} um/px tiles"
        if r.training_mpp
        else "  trained:   resolution not stated",
        f"  weights:   {r.source}",
        f"  licence:   {r.licence}",
        f"  checked:   {r.reference}",
        *weights_lines(
            f"wsi embed --tiles run/ --out run/ --encoder {name}", repo_of(r.source), r.weights_files
        ),
    ]
    click.echo("\n".join(lines))

"""The `wsi` entry point. Subcommands are imported only when run, so `wsi --help` stays instant."""

from __future__ import annotations

import importlib
import logging

import click

# name -> "module:attribute"; each module defines one click command.
_COMMANDS: dict[str, tuple[str, str]] = {
    "tile": ("wsi.cli.tile:command", "Find tissue and cut physical-size tiles from slides."),
    "embed": ("wsi.cli.embed:command", "Embed tiles with an encoder into per-slide HDF5 feature bags."),
    "encoders": ("wsi.cli.encoders:command", "List the named tile encoders: width, input, parameters, licence."),
    "train": ("wsi.cli.train:command", "Train an attention MIL model (or image ViT) for a task."),
    "predict": ("wsi.cli.predict:command", "Batch inference from raw slides, bags or images."),
    "info": ("wsi.cli.info:command", "Summarise a tile file or feature bag (ours, STAMP, CLAM, TRIDENT)."),
    "demo": ("wsi.cli.demo:command", "Run the whole pipeline on generated sample slides."),
    "make-slides": ("wsi.cli.make_slides:command", "Write generated pyramidal sample slides (TIFF)."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        module_name, attr = _COMMANDS[cmd_name][0].split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help from the table above, so listing commands imports none of them.
        with formatter.section("Commands"):
            formatter.write_dl([(name, _COMMANDS[name][1]) for name in self.list_commands(ctx)])


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  wsi tile slides/ --out run/                     # tiles of 256 um at 1.0 um/px
  wsi embed --tiles run/ --out run/ --weights best_ckpt.pth
  wsi train --task nsclc-subtype --features run/features/retccl --labels labels.csv --out model/
  wsi predict --model model/ new-slides/ --out preds/
  wsi demo --out demo-out/                        # everything, on generated slides
""",
)
@click.version_option(package_name="wsi")
@click.option("-v", "--verbose", count=True, help="More log output (-v info is the default, -vv debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors on stderr.")
def cli(verbose: int, quiet: bool) -> None:
    """wsi: whole-slide images to tiles, feature bags and slide-level predictions."""
    level = logging.WARNING if quiet else (logging.DEBUG if verbose >= 2 else logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    logging.getLogger("distributed").setLevel(max(level, logging.WARNING))
    logging.getLogger("PIL").setLevel(logging.WARNING)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)

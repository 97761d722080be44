"""The `wsi` entry point. Subcommands are imported only when run, so `wsi --help` stays instant."""

from __future__ import annotations

import importlib
import io
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import click


class _Entry(NamedTuple):
    target: str  # "module:attribute" of the click command, imported only when the command runs
    summary: str  # one line for `wsi --help`, kept here so listing commands imports none of them


# The command table. Not a wsi.core.registry.Registry on purpose: a Registry learns its members by importing
# the modules that register them, so `wsi --help` would import every command module (measured 0.39 s
# instead of 0.16 s) and `wsi tile` would import all seven. tests/wsi/cli/test_cli_tile.py checks every entry
# resolves to a click command of that name, so the table cannot drift from the modules.
COMMANDS: dict[str, _Entry] = {
    "tile": _Entry("wsi.cli.tile:command", "Find tissue and cut physical-size tiles from slides."),
    "embed": _Entry("wsi.cli.embed:command", "Embed tiles with an encoder into per-slide HDF5 feature bags."),
    "embed-slides": _Entry(
        "wsi.cli.embed_slides:command", "Slide- or patient-level embeddings with a slide foundation encoder."
    ),
    "encoders": _Entry(
        "wsi.cli.encoders:command", "List the named tile encoders: width, input, parameters, licence."
    ),
    "train": _Entry("wsi.cli.train:command", "Train an attention MIL model (or image ViT) for a task."),
    "predict": _Entry("wsi.cli.predict:command", "Batch inference from raw slides, bags or images."),
    "zero-shot": _Entry(
        "wsi.cli.zero_shot:command", "Classify slides from classes named in words; retrieve tiles by text."
    ),
    "info": _Entry(
        "wsi.cli.info:command", "Summarise a tile file or feature bag (ours, STAMP, CLAM, TRIDENT)."
    ),
    "demo": _Entry("wsi.cli.demo:command", "Run the whole pipeline on generated sample slides."),
    "make-slides": _Entry("wsi.cli.make_slides:command", "Write generated pyramidal sample slides (TIFF)."),
    "view": _Entry("wsi.cli.view:command", "Look at a folder's slides, heatmaps and tiles in the browser."),
}


def load_command(name: str) -> click.Command:
    """The click command `name` of the table, importing its module now."""
    module_name, attr = COMMANDS[name].target.split(":")
    command = getattr(importlib.import_module(module_name), attr)
    if not isinstance(command, click.Command):
        raise TypeError(f"{COMMANDS[name].target} is not a click command")
    return command


class _LazyGroup(click.Group):
    def main(
        self, args: Sequence[str] | None = None, prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True, **extra: Any,
    ) -> Any:  # fmt: skip
        """click's main, with everything it writes shown through `wsi.storage.masking.shown`: usage errors
        quoting an option's value, and every line a command prints (a recipe's source, a table, a
        summary), so no output names a secret or this machine's cache folder for a URL."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        from wsi.storage.masking import MaskedStream, shown

        streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = MaskedStream(sys.stdout), MaskedStream(sys.stderr)
        try:
            try:
                code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            except click.ClickException as exc:
                text = io.StringIO()
                exc.show(file=text)
                sys.stderr.write(shown(text.getvalue()))
                sys.stderr.flush()
                sys.exit(exc.exit_code)
            except click.Abort:
                click.echo("Aborted!", err=True)
                sys.exit(1)
            sys.exit(code if isinstance(code, int) else 0)
        finally:
            sys.stdout, sys.stderr = streams

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name].summary) for name in self.list_commands(ctx)])


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
  wsi view preds/                                 # the slides and heatmaps in the browser
""",
)
@click.version_option(package_name="wsi")
@click.option("-v", "--verbose", count=True, help="More log output (-v info is the default, -vv debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors on stderr.")
def cli(verbose: int, quiet: bool) -> None:
    """wsi: whole-slide images to tiles, feature bags and slide-level predictions."""
    # Weights come from the Hugging Face cache as it is (wsi.storage.hf): no library in this process or
    # the ones it starts (timm, transformers, dask workers) may download at run time.
    os.environ["HF_HUB_OFFLINE"] = "1"
    level = logging.WARNING if quiet else (logging.DEBUG if verbose >= 2 else logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    logging.getLogger("distributed").setLevel(max(level, logging.WARNING))
    logging.getLogger("PIL").setLevel(logging.WARNING)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    logging.getLogger("pyvips").setLevel(logging.WARNING)  # libvips logs every thread pool at info
    for noisy in ("fsspec", "s3fs", "aiobotocore", "botocore", "urllib3"):  # every block read, every request
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    from wsi.core.errors import WsiError
    from wsi.storage.masking import mask_log_handlers, shown
    from wsi.storage.settings import check_environment

    mask_log_handlers()  # no log line prints a secret, or a local cache folder for a URL
    try:  # a bad WSI_* variable is one usage error now, not a failure per slide later
        check_environment()
    except WsiError as exc:
        click.echo(f"Error: {shown(exc)}", err=True)
        raise SystemExit(2) from None

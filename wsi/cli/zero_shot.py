"""`wsi zero-shot`: classify slides by classes named in words, or retrieve the tiles a text describes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from wsi.cli._common import EXIT_PARTIAL_FAILURE, ensure_writable_dir, user_errors
from wsi.cli._locations import LocalPath
from wsi.cli._options import config_options
from wsi.pipelines.zero_shot.config import ZeroShotOptions

# option -> ZeroShotOptions field: defaults, ranges and help come from pipelines/zero_shot/config.py
ZERO_SHOT_FLAGS = {
    "--model": "model",
    "--weights": "weights",
    "--tokenizer": "tokenizer",
    "--random-init": "random_init",
    "--top-k": "top_k",
    "--labels": "labels_csv",
    "--heatmaps": "heatmaps",
    "--geojson": "geojson",
    "--mpp": "mpp",
    "--device": "device",
    "--top": "top",
    "--bootstrap": "bootstrap",
    "--seed": "seed",
}


@click.command(
    "zero-shot",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  wsi zero-shot run/features/conch-v1 --prompts nsclc --weights /models/CONCH/ --out zs/   # LUAD vs LUSC
  wsi zero-shot bags/ --prompts classes.yaml --labels labels.csv --out zs/   # + metrics, report.html
  wsi zero-shot run/features/plip --model plip --weights /models/plip/ --prompts classes.yaml --out zs/
  wsi zero-shot run/titan-slide --model titan --prompts nsclc --out zs/      # TITAN slide embeddings
  wsi zero-shot run/features/conch-v1.5 --model titan --prompts nsclc --out zs/   # TITAN run on the bags
  wsi zero-shot bags/ --query "tumour-infiltrating lymphocytes" --top 24 --out tils/   # retrieval
  wsi zero-shot bags/ --query-tile TCGA-XX 10240 8192 --out similar/        # tiles like this one

\b
Prompt file (YAML): `classes:` maps each class to its names; `templates:` (optional, each with
CLASSNAME) default to the model authors' ensemble (CONCH 22, TITAN 23, PLIP "An H&E image of
CLASSNAME."). Packaged: nsclc. Pooling: conch-v1 and plip score every tile and average each class's
top-k tile similarities (MI-Zero); titan and prism score the slide embedding. Probabilities are
softmax(logit_scale * similarity) with the model's own scale (TITAN's authors use none; PRISM sums the
per-prompt probabilities of each class). Bags must come from the tower's own image side (conch-v1
bags for conch-v1, plip bags for plip: wsi embed --encoder NAME with the same weights file); others
are refused (exit 2) naming the bag.

\b
Output (under --out): predictions.csv (slide, prob_<class>, predicted, the pooled similarities),
manifest.csv, heatmaps/<slide>.json + <slide>_<class>.png (tile similarities, shown by `wsi view`),
geojson/<slide>.geojson (QuPath: tiles with `similarity <class>`, each class's top tiles), with
--labels metrics.json + report.html as `wsi predict --labels`; text_embeddings/ caches the prompt
set's embeddings. Retrieval: top_tiles.csv (slide, similarity, position) and top_tiles/*.png.
Weights and tokenizer files are never downloaded: docs/zero_shot.md says which files each model needs.
""",
)
@click.argument("inputs", nargs=-1, required=True, type=LocalPath(exists=True))  # URLs named as such
@click.option(
    "--out", "out_dir", required=True, type=LocalPath(file_okay=False), help="Output folder (local)."
)
@click.option(
    "--prompts", default=None, help="Prompt file (YAML, or CONCH's JSON) or a packaged set (nsclc)."
)
@click.option("--query", default=None, help="Retrieval: the tiles most like this text.")
@click.option(
    "--query-tile",
    nargs=3,
    type=(str, float, float),
    default=None,
    metavar="SLIDE X_UM Y_UM",
    help="Retrieval: the tiles most like this slide's tile at (x, y) micrometres.",
)
@config_options(ZeroShotOptions, ZERO_SHOT_FLAGS, into="settings")
@user_errors
def command(
    inputs: tuple[Path, ...],
    out_dir: Path,
    prompts: str | None,
    query: str | None,
    query_tile: tuple[str, float, float] | None,
    settings: dict[str, Any],
) -> None:
    """Classify slides zero-shot from prompts, or retrieve tiles by a text or a tile."""
    from wsi.core.config import parse_config
    from wsi.core.errors import ConfigError

    options = parse_config(ZeroShotOptions, settings, source="wsi zero-shot options")
    retrieval = query is not None or query_tile is not None
    if retrieval == (prompts is not None):
        raise ConfigError(
            "give --prompts (classification) or --query / --query-tile (retrieval), one of them"
        )
    ensure_writable_dir(out_dir)
    if retrieval:
        from wsi.pipelines.zero_shot import retrieve

        found = retrieve(list(inputs), out_dir=out_dir, query=query, query_tile=query_tile, options=options)
        click.echo(
            f"wsi zero-shot: {len(found.rows)} tile(s) most like {found.query!r} -> {found.csv}", err=True
        )
        return
    from wsi.pipelines.zero_shot import zero_shot

    assert prompts is not None
    result = zero_shot(list(inputs), out_dir=out_dir, prompts=prompts, options=options)
    counts = {c: 0 for c in result.classes}
    for row in result.scored:
        counts[row.predicted] += 1
    line = ", ".join(f"{c} {n}" for c, n in counts.items())
    click.echo(
        f"wsi zero-shot ({result.model}): {len(result.scored)} of {len(result)} slide(s) scored ({line}) "
        f"-> {result.predictions_csv}",
        err=True,
    )
    if result.metrics:
        auroc = result.metrics.get("auroc")
        click.echo(
            f"  AUROC {auroc:.3f} on the labelled slides; report: {out_dir / 'report.html'}"
            if isinstance(auroc, float)
            else f"  metrics: {out_dir / 'metrics.json'}",
            err=True,
        )
    for r in result.problems[:10]:
        click.echo(f"  {r.slide_id}: {r.error}", err=True)
    if result.problems:
        raise SystemExit(EXIT_PARTIAL_FAILURE)

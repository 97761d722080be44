"""`wsi tile`: find tissue and cut physical-size tiles from slides."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from wsi.cli._common import EXIT_PARTIAL_FAILURE, EXIT_USAGE, ensure_writable_dir, user_errors
from wsi.cli._locations import PathOrUrl
from wsi.cli._options import config_options
from wsi.pipelines.tile.config import SegmentationOptions, TileOptions
from wsi.storage import Url
from wsi.tiling.params import ARTIFACT_DESCRIPTIONS, ARTIFACT_FILTERS, DEFAULT_FILTERS, TileParams

if TYPE_CHECKING:
    from wsi.pipelines.tile.findings import FilterShare, HeavyFilters, TileResult

# option -> field; defaults, ranges and help come from the fields (wsi.tiling.grid, pipelines/tile/config.py)
TILE_PARAM_FLAGS = {
    "--tile-um": "tile_um", "--tile-px": "tile_px", "--min-tissue": "min_tissue_fraction",
    "--max-background": "max_background_fraction", "--white-level": "white_level",
    "--min-blur-var": "min_blur_variance", "--max-unreadable": "max_unreadable_fraction",
    "--thumb-mpp": "tissue.thumb_mpp", "--min-saturation": "tissue.min_saturation",
}  # fmt: skip
TILE_OPTION_FLAGS = {
    "--mpp": "mpp", "--backend": "backend", "--workers": "workers", "--scheduler": "scheduler",
    "--threads": "threads", "--save-tiles": "save_tiles", "--overwrite": "overwrite",
    "--background": "background", "--roi": "roi", "--mpp-override": "mpp_override", "--review": "review",
    "--max-read-gpx": "max_read_gpx", "--progress": "progress",
}  # fmt: skip
SEGMENTATION_FLAGS = {
    "--tissue-model": "tissue_model", "--tissue-weights": "tissue_weights",
    "--artifact-model": "artifact_model", "--artifact-weights": "artifact_weights",
    "--max-artifact": "max_artifact_fraction", "--device": "device",
}  # fmt: skip

_DEFAULTS_NOTE = "Defaults suit H&E; every setting is saved as JSON in each tile file."
#: up to this many slides a filter removed much tissue of are named one per line; more, one line per filter
_MAX_EACH = 3


_EPILOG = """\b
Examples:
  wsi tile slides/ --out run/                      # every slide in a folder, 256 um at 1.0 um/px
  wsi tile a.svs b.ndpi --out run/ --tile-um 224 --tile-px 224
  wsi tile slides.csv --out run/ --workers 4       # CSV: path[,slide_id][,mpp]
  wsi tile old-scan.svs --out run/ --mpp 0.25      # a slide without resolution metadata
  wsi tile thumb.png photo.jpg --out run/ --mpp 8  # plain images as one-level slides
  wsi tile slides/ --out run/ --scheduler tcp://10.0.0.5:8786 --save-tiles
  wsi tile a.svs --out run/ --roi a.geojson        # only inside QuPath annotations
  wsi tile slides/ --out run/ --roi annotations/   # annotations/<slide_id>.geojson per slide
  wsi tile scans/ --out run/ --mpp 0.5 --mpp-override   # the metadata's mpp is wrong: use 0.5
  wsi tile slides/ --out run/ --tissue-model grandqc-tissue --tissue-weights td.pth
  wsi tile slides/ --out run/ --artifact-model grandqc-artifact --artifact-weights qc.pth
  wsi tile dicom/ --out run/       # a folder of DICOM series folders: one slide per series
  wsi tile slides/ --out run/ --no-filter ink --no-filter dust   # keep inked tiles and specks
  wsi tile slides/ --out run/ --review reviewed/   # tiles re-classed in QuPath (no slide re-read)
  wsi tile s3://lab/slides/ --out s3://lab/run/ --backend tiffslide   # in object storage (range reads)

\b
Output (under --out):
  tiles/<slide_id>.h5     kept tiles' coords (level-0 px) and coords_um, settings, counts
  tiles/<slide_id>.zarr   kept tiles' pixels (with --save-tiles)
  qc/<slide_id>.png       the slide (1200 px): tissue outline; kept green, background blue,
                          blurry red, unreadable magenta, undecodable parts of the file hatched;
                          artifacts: ink orange, fold brown, bubble cyan, border near-black,
                          dust pink, blood wine (--filter blood); legend with counts (ink per marker
                          colour), slide id, mpp
  qc/<slide_id>.geojson   the same as QuPath objects (File > Import objects), level-0 px:
                          tissue outline (annotation "Tissue"), every tissue tile classed
                          by its fate (kept, background, blurry, ink, ...) with its tissue fraction
  tiles/manifest.csv      one row per slide: slide, path, status, tiles, seconds, error, note
                          (note: tiles rejected per artifact, e.g. "rejected as artifacts: 12 ink
                          (8 red, 4 brown)": ink by marker colour, also per tile in the tile file;
                          "check filter: ink removed 11.0% (172 of 1563) ..." when one filter
                          removed over 5% of the slide's tissue tiles; the review applied)

\b
Artifact filters (no weights; brightfield slides; on by default but blood, --no-filter NAME turns one
off, --filter blood turns blood on):
""" + "".join(f"  {name:<8} {ARTIFACT_DESCRIPTIONS[name]}\n" for name in ARTIFACT_FILTERS) + """\
Thresholds: TileParams.artifacts (wsi.tiling.artifacts.ArtifactParams), saved in each tile file.
A filter (or blur) that removes over 5% of a slide's tissue tiles is named with its share in
the note and the summary: look at qc/<slide_id>.png before trusting the slide's bag.

\b
Review (--review FILE|FOLDER): open qc/<slide_id>.geojson in QuPath, re-class tiles (class
"kept" keeps a tile, any other class drops it), draw annotations classed Ignore* or Exclude
over regions to drop, File > Export objects as GeoJSON to another folder, and pass the file
(one slide) or a folder of <slide_id>.geojson. Tiles the file leaves out keep the filters'
verdict. Applied from the tile file (every candidate tile is stored in it) without reading
the slide, except with --save-tiles the pixels of tiles it newly keeps; a re-run with the same
file is skipped, one without --review goes back to the filters' verdicts.

\b
Status per slide: ok, skipped (done before), empty (kept no tile: the error column names the
filter that rejected most tiles and the option to change), failed. A slide whose id is taken in
--out by another slide file, or that differs only by case from another slide's id, is failed.
A corrupt tile in a slide file costs only the tiles it touches: the slide is ok, and the error
column names where (level-0 px); a file with over 5% of its tiles under the tissue corrupt fails.
Fluorescence and other dark-background slides are detected and tiled with filters that fit them.

\b
Exit code: 0 all slides done (or skipped as already done), 1 some slides failed or kept no tile
(see the manifest), 2 a usage error (nothing ran). Re-running skips finished slides; --overwrite
redoes them (and replaces the tiles of another slide with the same id).
"""


@click.command(
    "tile", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}, epilog=_EPILOG
)
@click.argument("paths", nargs=-1, required=True, type=PathOrUrl())
@click.option(
    "--out", "out_dir", required=True, type=PathOrUrl(file_okay=False),
    help="Output folder, or a URL (s3://bucket/run/: written locally, each file uploaded when finished).",
)  # fmt: skip
@config_options(TileParams, TILE_PARAM_FLAGS, into="tiling")
@config_options(TileOptions, TILE_OPTION_FLAGS, into="run")
@click.option(
    "--no-filter",
    "no_filter",
    multiple=True,
    type=click.Choice(list(ARTIFACT_FILTERS)),
    help="Turn an artifact filter off (repeat for several): " + ", ".join(DEFAULT_FILTERS) + ".",
)
@click.option(
    "--filter",
    "add_filter",
    multiple=True,
    type=click.Choice([name for name in ARTIFACT_FILTERS if name not in DEFAULT_FILTERS]),
    help="Turn on a filter that is off by default: blood (tiles mostly blood: haemorrhage, clots; named "
    "'blood', never 'ink').",
)
@config_options(SegmentationOptions, SEGMENTATION_FLAGS, into="networks")
@user_errors
def command(
    paths: tuple[Path | Url, ...],
    out_dir: Path | Url,
    tiling: dict[str, Any],
    run: dict[str, Any],
    no_filter: tuple[str, ...],
    add_filter: tuple[str, ...],
    networks: dict[str, Any],
) -> None:
    """Find tissue and cut tiles of a physical size (micrometres) from whole-slide images.

    PATHS are slide files (a DICOM .dcm opens its whole series), folders (searched for .svs .tif .tiff
    .ndpi .vms .vmu .scn .mrxs .svslide .bif .czi and for DICOM WSI series: one slide per series, its
    id the folder's name) or CSV slide lists with a `path` column (optional `slide_id`, `mpp`; relative
    paths are taken from the CSV's folder). Each may be a URL (s3://, gs://, https://): see README
    "Slides and outputs in object storage". A plain image (.png .jpg .jpeg, a TIFF in strips) named as a
    PATH or in a CSV is a one-level slide at --mpp (or a resolution its metadata can be trusted for);
    folders are not searched for them. A failing slide is recorded in the manifest and never stops the
    others.
    """
    # Heavy imports here, so `wsi tile --help` stays instant.
    from wsi.pipelines.tile.stage import tile_slides
    from wsi.slides.sources import find_slides

    sources = find_slides(paths)
    if not sources:
        click.echo(f"Error: no slide files found in {', '.join(map(str, paths))}", err=True)
        raise SystemExit(EXIT_USAGE)
    params, options, segmentation = _typed_options(tiling, run, no_filter, add_filter, networks)
    ensure_writable_dir(out_dir)  # before any slide is read; after the checks above, which create nothing
    result = tile_slides(sources, out_dir=out_dir, params=params, options=options, segmentation=segmentation)
    _summary(result, out_dir)
    if result.problems:
        raise SystemExit(EXIT_PARTIAL_FAILURE)


def _typed_options(
    tiling: dict[str, Any], run: dict[str, Any], no_filter: tuple[str, ...], add_filter: tuple[str, ...],
    networks: dict[str, Any],
) -> tuple[TileParams, TileOptions, SegmentationOptions]:  # fmt: skip
    """The options as the stage's typed configs (a bad value: ConfigError, exit 2), before any slide is
    read: the filters turned on and off, and each network's weights as a local file."""
    from wsi.core.config import parse_config

    tiling = {
        **tiling,
        "artifacts": {
            "filters": [
                name for name in ARTIFACT_FILTERS
                if (name in DEFAULT_FILTERS or name in add_filter) and name not in no_filter
            ]
        },
    }
    params = parse_config(TileParams, tiling, source="wsi tile options")  # ConfigError: exit 2
    options = parse_config(TileOptions, run, source="wsi tile options")
    if options.mpp_override and options.mpp is None:
        click.echo("Error: --mpp-override needs --mpp (the value to use for every slide)", err=True)
        raise SystemExit(EXIT_USAGE)
    for kind in ("tissue", "artifact"):  # the local weights file, the same for every worker
        networks[f"{kind}_weights"] = _located(networks[f"{kind}_model"], networks[f"{kind}_weights"], kind)
    # ConfigError (a model without weights): exit 2
    segmentation = parse_config(SegmentationOptions, networks, source="wsi tile options")
    return params, options, segmentation


def _summary(result: TileResult, out_dir: Path | Url) -> None:
    """The closing lines on stderr, from the result's fields: the counts, artifacts, each problem slide,
    then the slides to look at first (low yield, a filter that took much tissue)."""
    from wsi.pipelines.tile.stage import TILE_LABELS, TILE_UNIT

    line = result.summary.line("tile", unit=TILE_UNIT, labels=TILE_LABELS)
    click.echo(f"wsi {line}; manifest {out_dir / 'tiles' / 'manifest.csv'}", err=True)
    from wsi.pipelines.tile.artifacts import artifact_summary

    found = [r.findings for r in result if r.findings is not None]
    artifacts = artifact_summary([f.counts for f in found])
    if artifacts:
        click.echo(f"  {artifacts}", err=True)
    for r in result.problems:
        click.echo(f"  {r.status} {r.slide_id}: {r.error}", err=True)
    done = [r for r in result if r.status in ("ok", "skipped") and r.findings is not None]
    for r in done:  # ok, but kept under 10% of its tissue tiles: named with the filter to loosen
        if r.findings is not None and r.findings.low_yield is not None:
            click.echo(f"  {r.slide_id}: {r.findings.low_yield.text()}", err=True)
    heavy = [r.findings.heavy for r in done if r.findings is not None and r.findings.heavy]
    for line in heavy_filter_lines(heavy):  # one filter took over 5% of the tissue tiles: look first
        click.echo(f"  {line}", err=True)


def heavy_filter_lines(heavy: Sequence[HeavyFilters]) -> list[str]:
    """The summary's lines for slides of which one filter removed over 5% of the tissue tiles: each
    slide's finding when a few are, else one line per filter with its slides, their range and the option
    (20 slides with one planted blur, as the demo's, are one line, not 20)."""
    from wsi.pipelines.tile.findings import HEAVY_FILTER

    if len(heavy) <= _MAX_EACH:
        return [f"{h.slide_id}: {h.text()}" for h in heavy]
    by_filter: dict[str, list[tuple[str, FilterShare]]] = {}
    for h in heavy:
        for f in h.filters:
            by_filter.setdefault(f.name, []).append((h.slide_id, f))
    lines = []
    for name, hits in by_filter.items():
        lo, hi = min(f.share for _, f in hits), max(f.share for _, f in hits)
        span = f"{lo:.1%}" if lo == hi else f"{lo:.1%}-{hi:.1%}"
        named = ", ".join(slide for slide, _ in hits[:_MAX_EACH])
        more = f" and {len(hits) - _MAX_EACH} more" if len(hits) > _MAX_EACH else ""
        slides, each = ("slides", " each") if len(hits) > 1 else ("slide", "")
        lines.append(
            f"check filter: {name} removed over {HEAVY_FILTER:.0%} of the tissue tiles of {len(hits)} "
            f"{slides} ({span}{each}: {named}{more}); look at their qc/<slide>.png; if it took tissue: "
            f"{hits[0][1].option}"
        )
    return lines


def _located(model: str | None, weights: str | None, kind: str) -> str | None:
    """--*-weights as given; a URL: its local copy; left out (or hf:ORG/REPO) for a model: its file in the
    Hugging Face cache (offline; `segmenter_weights`). Never Path(url), which would fold s3:// to s3:/."""
    from wsi.storage import is_url

    if model is None or (weights is not None and not weights.startswith("hf:") and not is_url(weights)):
        return str(Path(weights).absolute()) if weights else weights
    from wsi.models.segmentation.named import segmenter_weights

    return str(segmenter_weights(model, kind, weights).absolute())  # type: ignore[arg-type]

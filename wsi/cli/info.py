"""`wsi info`: summarise a slide, a tile file or a feature bag (ours, STAMP, CLAM, TRIDENT), or a folder
of them (`wsi.formats.folder_info`: this module only formats its summary)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import click

from wsi.cli._common import user_errors
from wsi.cli._locations import PathOrUrl
from wsi.cli._options import config_options, field_type
from wsi.pipelines.tile.config import TileOptions
from wsi.storage.urls import Url

if TYPE_CHECKING:  # h5py and numpy (wsi.formats.folder_info) load only when a folder is summarised
    from wsi.formats.folder_info import FolderSummary, Manifest, RunSummary, Spread

#: unusable files and failed manifest rows listed by name in the text output (--json lists all)
MAX_LISTED = 10


@click.command(
    "info",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  wsi info slides/slide1.svs                      # vendor, levels, size, mpp and its source, objective
  wsi info run/tiles/slide1.h5
  wsi info run/features/retccl/slide1.h5
  wsi info clam_features/slide1.h5 --mpp 0.25     # CLAM/TRIDENT coords are level-0 pixels
  wsi info run/features/retccl/*.h5 --json
  wsi info run/features/retccl                    # the folder: encoder, width, tiles per slide, manifest
  wsi info run/                                   # a run folder: tiles/ and each features/<encoder>/
  wsi info dicom/case1/                           # a DICOM whole-slide series folder: its slide
  wsi info run/features/retccl --read-features    # also read every bag's features for NaN (slower)
A folder is judged from HDF5 attributes and shapes only (10,000 bags in ~20 s): unreadable and empty
bags; NaN features need --read-features (or `wsi info` on the bags themselves).
Exit status 1 when a bag is one wsi train and predict refuse (its `usable` line says why), or a tile
file of a folder cannot be read.
""",
)
@click.argument("files", nargs=-1, required=True, type=PathOrUrl())
@click.option(
    "--mpp",
    type=field_type(TileOptions, "mpp"),  # the range of a slide's mpp
    default=None,
    help="Level-0 um/px: for CLAM/TRIDENT bags (their coordinates are in pixels), or a slide without one.",
)
@config_options(TileOptions, {"--backend": "backend"}, into="reading")
@click.option(
    "--read-features",
    is_flag=True,
    help="For a folder: also read every bag's features for NaN / infinite values (bounded memory, slower).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per file or folder instead of text.")
@user_errors
def command(
    files: tuple[Path, ...], mpp: float | None, reading: dict[str, str], read_features: bool, as_json: bool
) -> None:
    """Print a summary of slides, tile files and feature bags (sizes, resolution, provenance, extent), or
    of a folder of them (what it holds, tiles per slide, unusable files, its manifest)."""
    import h5py

    from wsi.core.errors import BagFormatError
    from wsi.formats.bags import bag_info
    from wsi.formats.folder_info import RunSummary, folder_info
    from wsi.formats.tile_file import is_tile_file, tile_file_info
    from wsi.slides.slide_info import slide_info
    from wsi.storage.masking import shown

    refused = 0
    checked: Counter[str] = Counter()  # files that could be refused, by kind: "bag", "tile file"
    paths = [part for given in files for part in _series_or_folder(_local(given))]
    for i, path in enumerate(paths):
        if path.is_dir():
            found = folder_info(path, features=read_features)
            refused += len(found.unusable)
            for part in found.parts if isinstance(found, RunSummary) else [found]:
                checked["bag"] += part.bags.count if part.bags else 0
                checked["tile file"] += part.tile_files.count if part.tile_files else 0
            if as_json:
                click.echo(json.dumps(found.to_json(), default=str))
            else:
                click.echo("\n" * bool(i) + "\n".join(_folder_lines(found)))
            continue
        if not path.is_file():
            raise BagFormatError(f"{path}: file not found")
        if not h5py.is_hdf5(path):  # not a tile file or a bag: a slide, or a SlideError naming it
            summary = slide_info(path, backend=reading["backend"], mpp=mpp)
        else:
            tiles = is_tile_file(path)
            summary = tile_file_info(path) if tiles else bag_info(path, mpp=mpp)
            checked["tile file" if tiles else "bag"] += 1
        refused += "usable" in summary  # a bag train and predict refuse (why: its `usable`)
        if as_json:
            click.echo(json.dumps(summary, default=str))
            continue
        if i:
            click.echo("")
        width = max(len(k) for k in summary)
        for key, value in summary.items():
            click.echo(shown(f"{key:<{width}}  {value}"))  # a remote file by its URL, not its local copy
    if refused:  # not exit 0 for a bag that the next command refuses
        kinds = [kind for kind, n in checked.items() if n]
        noun = f"{kinds[0]}(s)" if len(kinds) == 1 else "file(s)"
        total = max(sum(checked.values()), refused)  # (a folder's unreadable .h5 is neither kind)
        click.echo(
            f"{refused} of {total} {noun} would be refused by the next command (wsi embed, train, predict)",
            err=True,
        )
        raise SystemExit(1)


def _local(given: Path | Url) -> Path:
    """A URL's file copied to the local cache, or its folder pulled into this machine's mirror."""
    from wsi.storage import is_remote_file, local_file, local_folder

    if not isinstance(given, Url):
        return given
    return local_file(given, what="file") if is_remote_file(given) else local_folder(given)


def _series_or_folder(path: Path) -> list[Path]:
    """A folder holding DICOM whole-slide series (and no .h5) is its slides, as `wsi tile` reads it:
    each series' level-0 instance; any other path as given."""
    if not path.is_dir() or any(path.glob("*.h5")):
        return [path]
    dcm = sorted(p for p in path.iterdir() if p.suffix.lower() == ".dcm")
    if not dcm:
        return [path]
    from wsi.slides.dicom_series import find_series

    return [series.path for series in find_series(dcm)] or [path]


def _folder_lines(summary: FolderSummary | RunSummary) -> list[str]:
    """A folder summary as `key  value` lines; a run folder's parts one after another."""
    from wsi.formats.folder_info import RunSummary

    if isinstance(summary, RunSummary):
        names = ", ".join(p.folder for p in summary.parts)
        lines = [f"folder  {summary.folder}", f"kind    run folder: {names}"]
        for part in summary.parts:
            lines += ["", *_folder_lines(part)]
        return lines
    rows: list[tuple[str, str]] = [("folder", summary.folder), ("kind", summary.kind)]
    if summary.tile_files is not None:
        tiles = summary.tile_files
        sizes = ", ".join(f"{g.tile_um:g} um / {g.tile_px} px: {g.files}" for g in tiles.tile_sizes)
        mixed = "MIXED tile sizes: " if len(tiles.tile_sizes) > 1 else ""
        rows.append(("tile files", f"{tiles.count}; {mixed}{sizes or 'none readable'}"))
        rows.append(("tiles", _spread_text(tiles.tiles, tiles.empty)))
    if summary.bags is not None:
        bags = summary.bags
        kinds = ", ".join(
            f"{e.encoder} ({e.layout}, {e.dim} features, {e.dtype}): {e.bags}" for e in bags.encoders
        )
        mixed = "MIXED encoders (train on one encoder's bags): " if bags.mixed else ""
        rows.append(("bags", f"{bags.count}; {mixed}{kinds or 'none readable'}"))
        rows.append(("tiles", _spread_text(bags.tiles, bags.empty)))
    bad = summary.unusable
    usable = f"{summary.files - len(bad)} of {summary.files}"
    if bad:
        usable += f"; {len(bad)} refused by the next command (wsi embed, train, predict):"
    rows.append(("usable", usable))
    rows += [("", f"  {b.reason}") for b in bad[:MAX_LISTED]]
    if len(bad) > MAX_LISTED:
        rows.append(("", f"  ... and {len(bad) - MAX_LISTED} more (--json lists all)"))
    if summary.bags is not None:
        read = "features too" if summary.features_read else "attributes and shapes (--read-features: NaN too)"
        rows.append(("checked", read))
    rows += _manifest_rows(summary.manifest)
    width = max(len(k) for k, _ in rows)
    return [f"{k:<{width}}  {v}" for k, v in rows]


def _spread_text(spread: Spread | None, empty: int) -> str:
    if spread is None:
        return "none readable"
    text = f"{spread.total} in all; per slide min {spread.min} / median {spread.median:g} / max {spread.max}"
    return text + (f"; {empty} with no tiles" if empty else "")


def _manifest_rows(manifest: Manifest | None) -> list[tuple[str, str]]:
    if manifest is None:
        return [("manifest", "none (no manifest.csv in this folder)")]
    if manifest.error:
        return [("manifest", f"{manifest.file} {manifest.error}")]
    counts = ", ".join(f"{k} {v}" for k, v in manifest.status.items())
    rows = [("manifest", f"{manifest.file}: {manifest.slides} slides; {counts or 'no rows'}")]
    rows += [("", f"  failed {slide}: {error}") for slide, error in manifest.failed[:MAX_LISTED]]
    if len(manifest.failed) > MAX_LISTED:
        rows.append(("", f"  ... and {len(manifest.failed) - MAX_LISTED} more failed (--json lists all)"))
    return rows

"""`wsi info`: summarise a tile file or a feature bag (ours, STAMP, CLAM, TRIDENT)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from wsi._h5 import plain
from wsi.cli._common import user_errors


def _tile_summary(path: Path) -> dict[str, Any]:
    from wsi.tilefile import read_tile_file

    tf = read_tile_file(path)
    m = tf.meta
    out: dict[str, Any] = {"file": str(path), "kind": "tile file (wsi-tiles)", "tiles": len(tf)}
    keys = ("slide_id", "slide_path", "tile_size_um", "tile_size_px", "mpp", "target_mpp", "backend",
            "vendor", "n_grid", "n_tissue", "n_background", "n_blurry", "n_unreadable", "n_kept",
            "wsi_version")  # fmt: skip
    for key in keys:
        if key in m:
            out[key] = m[key]
    out["level0_size_px"] = f"{m.get('level0_width')} x {m.get('level0_height')}"
    if len(tf):
        lo, hi = tf.coords_um.min(axis=0), tf.coords_um.max(axis=0) + tf.tile_size_um
        out["extent_um"] = f"x {lo[0]:.0f}-{hi[0]:.0f}, y {lo[1]:.0f}-{hi[1]:.0f}"
    cache = path.with_suffix(".zarr")
    out["pixel_cache"] = str(cache) if cache.is_dir() else "none"
    return out


def _bag_summary(path: Path, mpp: float | None) -> dict[str, Any]:
    import numpy as np

    from wsi.bags import bag_layout, bag_length, load_bag, read_bag_attrs
    from wsi.errors import BagFormatError

    layout = bag_layout(path)
    out: dict[str, Any] = {
        "file": str(path),
        "kind": f"feature bag ({layout} layout)",
        "tiles": bag_length(path),
    }
    try:
        bag = load_bag(path, mpp=mpp)
    except BagFormatError as exc:  # e.g. CLAM without mpp: still say what is there
        attrs = read_bag_attrs(path)
        out["note"] = str(exc)
        out.update({k: v for k, v in attrs.items() if isinstance(v, str | int | float)})
        return out
    out["dim"] = bag.dim
    out["dtype"] = str(bag.feats.dtype)
    out["tile_size_um"] = bag.tile_size_um
    for key in ("slide_id", "encoder", "weights_sha256", "mpp", "tile_size_px", "n_bad_tiles", "precision",
                "created", "wsi_version", "extractor", "stamp_version"):  # fmt: skip
        if key in bag.meta:
            out[key] = bag.meta[key]
    if len(bag):
        lo = bag.coords_um.min(axis=0)
        hi = bag.coords_um.max(axis=0) + (bag.tile_size_um or 0.0)
        out["extent_um"] = f"x {lo[0]:.0f}-{hi[0]:.0f}, y {lo[1]:.0f}-{hi[1]:.0f}"
        feats = bag.feats.astype(np.float32)
        out["finite"] = bool(np.isfinite(feats).all())
        out["feature_mean_std"] = f"{float(feats.mean()):.4g} / {float(feats.std()):.4g}"
    return out


@click.command(
    "info",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  wsi info run/tiles/slide1.h5
  wsi info run/features/retccl/slide1.h5
  wsi info clam_features/slide1.h5 --mpp 0.25     # CLAM/TRIDENT coords are level-0 pixels
  wsi info run/features/retccl/*.h5 --json
""",
)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--mpp",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Level-0 um/px, for CLAM/TRIDENT bags (their coordinates are in pixels).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per file instead of text.")
@user_errors
def command(files: tuple[Path, ...], mpp: float | None, as_json: bool) -> None:
    """Print a summary of tile files and feature bags: counts, sizes, provenance, extent."""
    import h5py

    from wsi.errors import BagFormatError

    for i, path in enumerate(files):
        if not path.is_file():
            raise BagFormatError(f"{path}: file not found")
        try:
            with h5py.File(path, "r") as h5:
                fmt = h5.attrs.get("format")
        except OSError as exc:
            raise BagFormatError(f"{path} is not an HDF5 file ({exc})") from None
        fmt = plain(fmt)
        summary = _tile_summary(path) if fmt == "wsi-tiles" else _bag_summary(path, mpp)
        if as_json:
            click.echo(json.dumps(summary, default=str))
            continue
        if i:
            click.echo("")
        width = max(len(k) for k in summary)
        for key, value in summary.items():
            click.echo(f"{key:<{width}}  {value}")

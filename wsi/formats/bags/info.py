"""A bag's summary, as `wsi info` prints it: counts, sizes, provenance and extent, for any layout."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from wsi.core.errors import BagFormatError
from wsi.core.json_types import JsonObject
from wsi.formats.bags.check import count_nonfinite_rows, scan_bag
from wsi.formats.bags.read import read_bag, read_bag_header

#: attributes shown when present (ours, and STAMP's `extractor` / `stamp_version`)
_SHOWN = ("slide_id", "encoder", "weights_sha256", "mpp", "tile_size_px", "n_bad_tiles",
          "created", "wsi_version", "extractor", "stamp_version")  # fmt: skip


def bag_info(path: str | os.PathLike[str], *, mpp: float | None = None) -> JsonObject:
    """An ordered summary of one bag: file, kind, tiles, then what its layout lets us know.

    A CLAM/TRIDENT bag without `mpp` is summarised in level-0 pixels, with a `note` saying how to place
    it in micrometres. A bag that cannot be loaded (an empty one, say) still gets its attributes and a
    `note` with the reason. A bag that `wsi train` and `wsi predict` refuse (`wsi.formats.bags.scan_bag`:
    empty, non-finite features or positions, unreadable) gets `usable` saying so and why (`wsi info` then
    exits 1). Raises BagFormatError when the file is not a bag at all.
    """
    path = Path(path)
    header = read_bag_header(path)
    out: JsonObject = {
        "file": str(path),
        "kind": f"feature bag ({header.layout} layout)",
        "tiles": header.n_tiles,
    }
    bad = scan_bag(path)
    if bad is not None:
        out["usable"] = f"no, wsi train and predict refuse it: {bad.reason}"
    try:
        bag = read_bag(path, mpp=mpp, require_um=False)
    except BagFormatError as exc:  # e.g. an empty bag: still say what is there
        out["note"] = str(exc)
        out.update({k: v for k, v in header.attrs.items() if isinstance(v, str | int | float)})
        return out
    out["dim"] = bag.dim
    # two different facts, named apart: the file's number type, and the arithmetic the encoder ran in
    out["stored_as"] = str(bag.feats.dtype)
    if bag.meta.get("precision"):
        out["computed_in"] = bag.meta["precision"]
    out["tile_size_um"] = bag.tile_um
    for key in _SHOWN:
        if key in bag.meta and key not in out:
            out[key] = bag.meta[key]
    if bag.mpp_source and bag.mpp_source != "bag attribute mpp":
        out["mpp"], out["mpp_source"] = bag.mpp, bag.mpp_source
    if bag.coords_um is not None:
        lo = bag.coords_um.min(axis=0)
        hi = bag.coords_um.max(axis=0) + (bag.tile_um or 0.0)
        out["extent_um"] = f"x {lo[0]:.0f}-{hi[0]:.0f}, y {lo[1]:.0f}-{hi[1]:.0f}"
    elif bag.coords_px is not None:
        out["tile_size_px0"] = bag.tile_px0
        lo = bag.coords_px.min(axis=0)
        hi = bag.coords_px.max(axis=0) + (bag.tile_px0 or 0.0)
        out["extent_px"] = f"x {lo[0]:.0f}-{hi[0]:.0f}, y {lo[1]:.0f}-{hi[1]:.0f} (level 0)"
        out["note"] = "coordinates in level-0 pixels and no resolution in the bag; --mpp places them in um"
    if len(bag):
        feats = bag.feats.astype(np.float32)
        n_bad = count_nonfinite_rows(feats)
        out["finite"] = not n_bad
        if n_bad:
            out["nonfinite_tiles"] = n_bad
        ok = feats[np.isfinite(feats).all(axis=1)]
        if len(ok):
            out["feature_mean_std"] = f"{float(ok.mean()):.4g} / {float(ok.std()):.4g}"
    return out

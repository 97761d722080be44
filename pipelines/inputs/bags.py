"""The bag input stage: feature bags (ours, STAMP, CLAM, TRIDENT) -> padded batches for vit-wsi.

Bags are read only through `wsi.formats.bags.read_bag`, so every layout looks the same here. Whole bags are
the default; `bag_size` turns on random subsampling of at most that many tiles per training bag
(STAMP-style augmentation; validation, test and prediction always see every tile).

Every bag is checked for NaN / infinite features as it is loaded (`wsi.formats.bags.check_finite`), and
`BagInput.bad_items` scans a whole list before a run starts. CLAM and TRIDENT bags store level-0
pixels: their slide's resolution is, in this order, the per-slide `mpp_by_slide` (an `mpp` column of the
labels CSV), the run-wide `mpp` (--mpp), then the bag's own attributes (TRIDENT: 10 / magnification,
logged). A model that uses no tile positions (`uses_positions=False`) needs none of them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.utils.data import Dataset

from wsi.core.config import MAX_BAG_SIZE, MAX_MPP
from wsi.core.errors import ConfigError, WsiError
from wsi.core.files import is_temp_name
from wsi.core.json_types import JsonObject, JsonValue
from wsi.core.suffixes import BAG_SUFFIX
from wsi.formats.bags import (
    find_bad_bags,
    read_bag_attrs,
    read_bag_header,
)
from wsi.formats.bags.folders import no_bags_message, tile_files_message
from wsi.pipelines.inputs import INPUTS, Batch, DataModelKwargs, Item
from wsi.pipelines.inputs.bag_dataset import BagDataset, collate_bags
from wsi.pipelines.inputs.samples import Sample

log = logging.getLogger(__name__)

#: bag attributes that must agree between the bags a model was trained on and those it predicts on
_ENCODER_KEYS = ("encoder", "weights_sha256")


def _check_mpp(value: Any, what: str) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not 0 < value <= MAX_MPP:
        raise ConfigError(f"{what} must be a number of um/px (level 0) in (0, {MAX_MPP:g}], not {value!r}")
    return float(value)


def _stain_of(attrs: Mapping[str, JsonValue]) -> tuple[JsonValue, JsonValue]:
    return attrs.get("stain_norm") or None, attrs.get("stain_reference_sha256") or None


def _check_stain(provenance: Mapping[str, JsonValue], items: Sequence[Item]) -> None:
    """Refuse bags whose stain normalisation (method and reference) is not the run's: features of
    normalised and raw tiles differ, and a model fed the other kind answers wrongly without a sign.
    Runs recorded before the stain fields existed carry no `stain_norm` key and are not checked."""
    if "stain_norm" not in provenance:
        return
    want = _stain_of(provenance)
    bad: list[str] = []
    for item in items:
        try:
            got = _stain_of(read_bag_header(item.path).attrs)
        except WsiError:
            continue  # unreadable: fails on its own later
        if got != want:
            bad.append(f"{item.path.name} ({got[0] or 'none'}, reference {str(got[1])[:12]})")
    if bad:
        method = want[0] or "none"
        raise ConfigError(
            f"the model was trained on features of tiles with stain normalisation {method} (reference sha256 "
            f"{str(want[1])[:12]}), but {len(bad)} bag(s) differ: "
            + "; ".join(bad[:5])
            + ("; ..." if len(bad) > 5 else "")
            + ". Embed the slides as the training bags were (`wsi embed --stain-norm "
            + f"{method} --stain-reference <the training reference>`, or no --stain-norm for none); "
            "predicting raw slides does not re-apply stain normalisation yet."
        )


@INPUTS.register("bags")
class BagInput:
    """`input: bags`. Options (task YAML `input_options`, or keywords from the train/predict code):

    bag_size: at most this many randomly chosen tiles per training bag (None = whole bags, default).
    mpp: run-wide level-0 um/px (`--mpp`) for CLAM/TRIDENT bags that store pixel coordinates.
    mpp_by_slide: {slide id: level-0 um/px} (an `mpp` column of the labels CSV); wins over `mpp`, and
        both win over what a bag's attributes say (TRIDENT's nominal 10 / level0_magnification).
    uses_positions: False when the model ignores tile positions (no positional encoding): bags in
        pixels then need no mpp at all. True (default) refuses such a bag, naming the options above.
    """

    name: ClassVar[str] = "bags"
    source_option: ClassVar[str] = "--features"

    def __init__(
        self,
        *,
        bag_size: int | None = None,
        mpp: float | None = None,
        mpp_by_slide: Mapping[str, float] | None = None,
        uses_positions: bool = True,
    ) -> None:
        if bag_size is not None and (
            not isinstance(bag_size, int) or isinstance(bag_size, bool) or not 1 <= bag_size <= MAX_BAG_SIZE
        ):
            raise ConfigError(
                f"input_options.bag_size must be an integer from 1 to {MAX_BAG_SIZE} or null, "
                f"not {bag_size!r}"
            )
        self.bag_size = bag_size
        self.mpp = _check_mpp(mpp, "mpp (--mpp)")
        by_slide: dict[str, float] = {}
        for slide_id, value in (mpp_by_slide or {}).items():
            checked = _check_mpp(value, f"the mpp of slide {slide_id!r} (labels CSV `mpp` column)")
            if checked is not None:
                by_slide[str(slide_id)] = checked
        self.mpp_by_slide = by_slide
        self.uses_positions = bool(uses_positions)

    def with_resolution(
        self,
        *,
        mpp: float | None = None,
        mpp_by_slide: Mapping[str, float] | None = None,
        uses_positions: bool | None = None,
    ) -> BagInput:
        """A copy with the run's resolution facts, for code that built the adapter from the task YAML
        before reading the labels CSV; None keeps this adapter's value."""
        return BagInput(
            bag_size=self.bag_size,
            mpp=self.mpp if mpp is None else mpp,
            mpp_by_slide=self.mpp_by_slide if mpp_by_slide is None else mpp_by_slide,
            uses_positions=self.uses_positions if uses_positions is None else uses_positions,
        )

    def bad_items(self, items: Sequence[Item]) -> list[tuple[Item, str]]:
        """Every item whose bag cannot be used (NaN/infinite features, unreadable, empty), with the reason
        naming the file. Bounded memory per bag; call it before training to refuse the run at once."""
        bad = {b.path: b.reason for b in find_bad_bags(item.path for item in items)}
        return [(item, bad[item.path]) for item in items if item.path in bad]

    def find(self, sources: Sequence[Path]) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for source in map(Path, sources):
            if source.is_dir():
                files = sorted(p for p in source.glob(f"*{BAG_SUFFIX}") if not is_temp_name(p))
                if not files:
                    raise ConfigError(no_bags_message(source))
                if (tiles := tile_files_message(source)) is not None:
                    raise ConfigError(tiles)
            elif source.is_file() and source.suffix == BAG_SUFFIX:
                files = [source]
            else:
                raise ConfigError(f"{source} is neither a folder of bags nor an .h5 bag")
            for path in files:
                slide_id = path.stem
                if slide_id in found and found[slide_id] != path:
                    raise ConfigError(f"two bags for slide {slide_id!r}: {found[slide_id]} and {path}")
                found[slide_id] = path
        return found

    def dataset(self, items: Sequence[Item], *, train: bool) -> Dataset[Sample]:
        return BagDataset(
            items, bag_size=self.bag_size if train else None, mpp=self.mpp, mpp_by_slide=self.mpp_by_slide,
            uses_positions=self.uses_positions,
        )  # fmt: skip

    def collate(self, samples: list[Sample]) -> Batch:
        return collate_bags(samples)

    def model_kwargs(self, items: Sequence[Item]) -> DataModelKwargs:
        dims: dict[int, str] = {}
        for item in items:
            header = read_bag_header(item.path)
            if header.n_tiles:  # an empty bag has no width to agree on (bad_items names it)
                dims.setdefault(header.dim, item.path.name)
        if len(dims) > 1:
            listed = "; ".join(f"{d}-d (e.g. {name})" for d, name in sorted(dims.items()))
            raise ConfigError(f"bags of different feature widths cannot train one model: {listed}")
        if not dims:
            raise ConfigError(f"every one of the {len(items)} bags is empty: no features to train on")
        return {"in_dim": next(iter(dims))}

    def provenance(self, items: Sequence[Item]) -> JsonObject:
        """How the features were made (from the bags' attributes), so predict can make them again."""
        seen: dict[tuple[Any, ...], list[str]] = {}
        first: JsonObject = {}
        for item in items:
            attrs = read_bag_attrs(item.path)
            key = tuple(attrs.get(k) for k in _ENCODER_KEYS)
            seen.setdefault(key, []).append(item.path.name)
            if not first:
                first = attrs
        if len(seen) > 1:
            parts = [
                f"{k[0]} (weights {str(k[1])[:12]}): {len(v)} bags, e.g. {v[0]}" for k, v in seen.items()
            ]
            raise ConfigError("bags were made by different encoders: " + "; ".join(parts))
        tile_params = first.get("tile_params")
        if isinstance(tile_params, str):
            with contextlib.suppress(ValueError, RecursionError):
                tile_params = json.loads(tile_params)
        return {
            "encoder": first.get("encoder"),
            "weights_sha256": first.get("weights_sha256"),
            "tile_size_um": first.get("tile_size_um"),
            "tile_size_px": first.get("tile_size_px"),
            "tile_params": tile_params,
            "target_mpp": first.get("target_mpp"),
            "input_px": first.get("input_px"),
            "precision": first.get("precision"),
            "feature_dim": read_bag_header(items[0].path).dim,
            "bag_format": first.get("format"),
            # stain normalisation before the encoder (None: none); compared by check_compatible
            "stain_norm": first.get("stain_norm"),
            "stain_reference_sha256": first.get("stain_reference_sha256"),
        }

    def check_compatible(self, provenance: Mapping[str, JsonValue], items: Sequence[Item]) -> None:
        """Refuse bags from another encoder or weights than the model was trained on."""
        want = {k: provenance.get(k) for k in _ENCODER_KEYS}
        dim = provenance.get("feature_dim")
        bad: list[str] = []
        unverified = 0
        for item in items:
            try:
                header = read_bag_header(item.path)
                attrs, item_dim = header.attrs, header.dim
            except WsiError:
                continue  # unreadable: that one item fails on its own later, the batch goes on
            if dim is not None and item_dim != dim:
                bad.append(f"{item.path.name} has {item_dim}-d features, the model {dim}-d")
                continue
            if any(want[k] is None or attrs.get(k) is None for k in _ENCODER_KEYS):
                unverified += 1
                continue
            diff = [f"{k} {attrs[k]!s:.16} != {want[k]!s:.16}" for k in _ENCODER_KEYS if attrs[k] != want[k]]
            if diff:
                bad.append(f"{item.path.name}: {', '.join(diff)}")
        if bad:
            raise ConfigError(
                f"the model was trained on features from encoder {want['encoder']} (weights sha256 "
                f"{str(want['weights_sha256'])[:16]}), but {len(bad)} bag(s) differ: "
                + "; ".join(bad[:5])
                + ("; ..." if len(bad) > 5 else "")
                + ". Embed the slides with the model's encoder and weights, or predict from raw slides."
            )
        if unverified:
            log.warning("%d bag(s) record no encoder/weights; cannot verify they match the model", unverified)
        _check_stain(provenance, items)

    def heatmap(
        self,
        item: Item,
        sample: Sample,
        contributions: torch.Tensor,
        out_png: Path,
        title: str = "",
        label: str | None = None,
    ) -> None:
        """Per-tile values (N,) drawn at the tile coordinates on a blank canvas (no slide here); `label`
        names the colour bar (default: contributions).

        Bags whose resolution is unknown are drawn in level-0 pixels (the picture is the same, only the
        unit differs)."""
        from wsi.pipelines.inputs.heatmaps import CONTRIBUTION_LABEL, render_heatmap

        if "coords_um" in sample:
            coords, size = sample["coords_um"].numpy(), sample.get("tile_um")
        else:
            coords, size = sample["coords_px"].numpy(), sample.get("tile_px0")
        if size is None:  # samples from older code, or one tile: the bag's own statement
            size = read_bag_attrs(item.path).get("tile_size_um")
        render_heatmap(
            coords_um=coords,
            tile_um=float(size or 1.0),
            values=contributions.float().numpy(),
            out_png=out_png,
            title=title,
            label=label or CONTRIBUTION_LABEL,
        )

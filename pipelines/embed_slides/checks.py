"""Does a bag of tile features fit a slide encoder? Tile encoder (and its weights), tile size, resolution.

A slide encoder was trained on one tile encoder's features of tiles of one size at one resolution; fed
anything else it returns a vector without complaint, so every bag is checked first and refused with a
message naming both encoders (or both sizes) and the command that makes fitting bags.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wsi.core.errors import BagFormatError, ConfigError, WsiError
from wsi.formats.bags import FORMAT, Bag, read_bag_attrs
from wsi.models.slide_encoders import SlideEncoderSpec

log = logging.getLogger(__name__)

#: STAMP's extractor names (KatherLab/STAMP c54ce06 src/stamp/preprocessing/config.py ExtractorName)
#: -> wsi tile-encoder names, with the weights digest a name implies where it implies one
STAMP_EXTRACTORS: dict[str, tuple[str, str | None]] = {
    "ctranspath": ("ctranspath", "7c998680060c8743551a412583fac689db43cec07053b72dfec6dcd810113539"),
    "chief-ctranspath": ("ctranspath", "1646f23001214f74cf432ef0e80b808ee6605143802ae6ed53a87564ddc4924a"),
    "conch1_5": ("conch-v1.5", None),
    "conch": ("conch-v1", None),
    "uni": ("uni", None),
    "uni2": ("uni2-h", None),
    "gigapath": ("prov-gigapath", None),
    # STAMP's "virchow" keeps the class token only (1280); "virchow-full" is the class token + mean patch
    # token (2560) that wsi's `virchow` and PRISM use (src/stamp/preprocessing/extractor/virchow*.py)
    "virchow": ("virchow (class token only)", None),
    "virchow-full": ("virchow", None),
    "virchow2": ("virchow2", None),
    "h-optimus-0": ("h-optimus-0", None),
    "h-optimus-1": ("h-optimus-1", None),
}
#: a bag's tile size may differ from the authors' by this fraction (grid rounding of the slide's mpp)
SIZE_TOLERANCE = 0.15


@dataclass(frozen=True)
class TileSource:
    """Which tile encoder (and weights) made a bag, from its attributes."""

    encoder: str  # wsi name ("conch-v1.5"); "" when the bag does not say
    weights_sha256: str | None  # None when unknown


def tile_source(bag: Bag) -> TileSource:
    if bag.provenance is not None:
        return TileSource(bag.provenance.encoder, bag.provenance.weights_sha256)
    return _source_of_attrs(bag.meta)


def _source_of_attrs(attrs: Mapping[str, Any]) -> TileSource:
    """`tile_source` from a bag's root attributes alone (no array read): ours, STAMP's, others'."""
    if attrs.get("format") == FORMAT:
        return TileSource(str(attrs.get("encoder", "") or ""), attrs.get("weights_sha256"))
    extractor = str(attrs.get("extractor", "") or "")
    if extractor:
        base = extractor.rsplit("-", 1)[0] if extractor not in STAMP_EXTRACTORS else extractor
        name, digest = STAMP_EXTRACTORS.get(base, (base, None))
        return TileSource(name, digest)
    return TileSource(str(attrs.get("encoder", "") or ""), None)


def check_folder(bags: Mapping[str, Path], spec: SlideEncoderSpec, name: str, folder: Path) -> None:
    """Refuse at once (ConfigError) a folder none of whose bags was made by a tile encoder the slide
    encoder reads: one line, not the same failure once per slide. Bags that cannot be read, or that do
    not name their encoder, are left to the per-slide check."""
    named: set[str] = set()
    for path in bags.values():
        with contextlib.suppress(OSError, ValueError, WsiError):
            named.add(_source_of_attrs(read_bag_attrs(path)).encoder)
    named.discard("")
    if named and not named & set(spec.tile_encoders):
        raise ConfigError(
            f"{folder}: its {len(bags)} bag(s) hold {', '.join(sorted(named))} features, but slide encoder "
            f"{name!r} reads {' or '.join(spec.tile_encoders)} features: {fix_for(spec)}"
        )


def fix_for(spec: SlideEncoderSpec) -> str:
    """The commands that make bags a slide encoder reads."""
    return (
        f"make bags for it with `wsi tile SLIDES --out RUN --tile-um {spec.tile_um:g} --tile-px "
        f"{round(spec.tile_um / spec.tile_mpp)}` then "
        f"`wsi embed --tiles RUN --out RUN --encoder {spec.tile_encoders[0]}`"
    )


def check_bag(bag: Bag, spec: SlideEncoderSpec, name: str) -> TileSource:
    """Refuse a bag made by another tile encoder, other weights, or at another tile size/resolution."""
    source = tile_source(bag)
    fix = fix_for(spec)
    if not source.encoder:
        raise BagFormatError(
            f"{bag.path} does not say which tile encoder made it; slide encoder {name!r} needs "
            f"{' or '.join(spec.tile_encoders)} features: {fix}"
        )
    if source.encoder not in spec.tile_encoders:
        raise BagFormatError(
            f"{bag.path} holds {source.encoder} features, but slide encoder {name!r} reads "
            f"{' or '.join(spec.tile_encoders)} features: {fix}"
        )
    if spec.tile_weights_sha256 and source.weights_sha256 not in spec.tile_weights_sha256:
        if source.weights_sha256 == "random":
            log.warning("%s: tile features from RANDOM %s weights (test run)", bag.path.name, source.encoder)
        else:
            raise BagFormatError(
                f"{bag.path} holds {source.encoder} features from weights sha256 "
                f"{str(source.weights_sha256)[:12]}, but slide encoder {name!r} was trained on "
                f"{source.encoder} weights {spec.tile_weights_sha256[0][:12]}: {fix} "
                "--weights <those weights>"
            )
    if bag.tile_um is not None:
        ratio = bag.tile_um / spec.tile_um
        if abs(ratio - 1.0) > SIZE_TOLERANCE:
            raise BagFormatError(
                f"{bag.path} holds tiles of {bag.tile_um:g} um, but slide encoder {name!r} was "
                f"trained on {spec.tile_um:g} um tiles ({spec.tile_mpp:g} um/px): {fix}"
            )
    mpp = bag.provenance.target_mpp if bag.provenance is not None else None
    if mpp is not None and abs(mpp / spec.tile_mpp - 1.0) > SIZE_TOLERANCE:
        raise BagFormatError(
            f"{bag.path} was embedded at {mpp:g} um/px, but slide encoder {name!r} was trained at "
            f"{spec.tile_mpp:g} um/px: {fix}"
        )
    if spec.uses_positions and bag.coords_um is None:
        raise BagFormatError(f"{bag.path} has no tile positions in micrometres; give --mpp for its slide")
    return source

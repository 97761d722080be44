"""Our bag format: its name and version, and the provenance every bag of ours carries.

`BagProvenance` is the one typed record of how a bag's features were made. The embed stage fills it in
one place (pipelines/embed/engine.py), `write_bag` stores it as the file's root attributes, and
`read_bag` reads it back (`Bag.provenance`), so writer and readers cannot disagree on a name.
The attribute names are the file format (docs/architecture.md "Bags"): they never change meaning.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime

from wsi.core.config import Count, Mpp, SidePx, Um, config_model, parse_config
from wsi.core.json_types import JsonObject
from wsi.formats.hdf5 import STORED_NAMES, from_stored, to_stored

FORMAT = "wsi-bag"
FORMAT_VERSION = 1
#: the bag layouts `read_bag` reads: ours, then STAMP's, CLAM's and TRIDENT's
LAYOUTS = ("wsi", "stamp", "clam", "trident")
#: STAMP's name for per-tile features; STAMP's readers need it as the root attribute `feat_type`
FEAT_TYPE = "tile"
#: root attributes that describe the file rather than how its features were made
FILE_ATTRS = ("unit", "n_tiles", "format", "format_version", "feat_type")
#: numeric fields stored as float64 / int64 attributes whatever number type the caller gave
_FLOATS = ("tile_um", "mpp", "target_mpp")
_INTS = ("tile_px", "level0_width", "level0_height", "input_px", "n_tiles_requested", "n_bad_tiles",
         "stain_fallback_tiles", "slide_size", "slide_header_bytes")  # fmt: skip
#: mapping fields, stored as JSON text attributes
_JSON = ("tile_params", "encoder_recipe", "stain_reference")


def _wsi_version() -> str:
    from wsi.core.version import __version__

    return __version__


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


#: a bag's root attributes as written: one number or text each (mappings as JSON text)
BagAttrs = dict[str, str | int | float]


@config_model
@dataclass(frozen=True)
class BagProvenance:
    """How one bag's features were made: what a re-run (skip or redo?), `wsi predict` (same encoder?)
    and a reader of the file (where are the tiles?) need to know. One HDF5 root attribute per field."""

    slide_id: str  # the slide's id; also the bag's file name
    encoder: str  # encoder *name* (retccl, timm:resnet18): enough to rebuild the encoder from a bag
    weights_sha256: str  # sha256 of the weights file; "random" for --random-init
    tile_um: Um  # tile side in micrometres
    tile_px: SidePx  # tile side in pixels as read from the slide (before the encoder's resize)
    mpp: Mpp  # the slide's level-0 um/px (from its metadata, --mpp or the slide list)
    level0_width: SidePx  # slide width at level 0, px
    level0_height: SidePx  # slide height at level 0, px
    tile_params: JsonObject  # the tile stage's parameters (`TileFileMeta.params`, stored as JSON)
    target_mpp: Mpp | None = None  # um/px of the tiles as read (tile_um / tile_px)
    encoder_id: str | None = None  # folder-safe encoder name: the bag's folder features/<encoder_id>/
    input_px: SidePx | None = None  # the encoder's input side, px (timm encoders may be resized)
    precision: str | None = None  # autocast precision used: bf16 | fp16 | fp32 (the CPU runs fp32)
    n_tiles_requested: Count | None = None  # tiles in the tile file
    n_bad_tiles: Count | None = None  # of those, unreadable and left out of the bag
    pixel_source: str | None = None  # where the pixels came from: "tile-cache" or "slide"
    slide_path: str | None = None  # the slide file embedded
    tile_file: str | None = None  # the tile file (tiles/<slide_id>.h5) the coordinates came from
    #: sha256 of the tile file's coords (`wsi.formats.tile_file.coords_digest`): another tile set (a review
    #: that swapped tiles, say) re-makes the bag even at the same count
    tiles_sha256: str | None = None
    encoder_recipe: JsonObject | None = None  # the encoder's recipe (`EncoderRecipe.as_dict`), as JSON
    recipe_sha256: str | None = None  # digest of the recipe fields that decide the features
    stain_norm: str | None = None  # stain normalisation before the encoder: macenko | reinhard; None: none
    stain_reference: JsonObject | None = None  # the stain reference tiles were mapped onto, as JSON
    stain_reference_sha256: str | None = None  # digest of that reference's numbers
    stain_fallback_tiles: Count | None = None  # tiles left as they were (no stable fit: background, pen)
    #: the slide file when its tiles were read (`wsi.storage.identity.SlideFingerprint`): its size, version
    #: (mtime or ETag) and header sha256; a re-run skips the bag only while the slide is that file
    slide_size: Count | None = None
    slide_version: str | None = None
    slide_header_sha256: str | None = None
    slide_header_bytes: Count | None = None
    wsi_version: str = field(default_factory=_wsi_version)  # the wsi that wrote the bag
    created: str = field(default_factory=_now)  # UTC time of writing, ISO 8601 to the second

    def __post_init__(self) -> None:
        for names, kind in ((_FLOATS, float), (_INTS, int)):
            for name in names:
                value = getattr(self, name)
                if value is not None:
                    object.__setattr__(self, name, kind(value))  # numpy scalars too

    def to_dict(self) -> BagAttrs:
        """The root attributes of the bag: mappings (`tile_params`...) as JSON, fields at None not written,
        under their stored names (`tile_size_um`, `tile_size_px`: `STORED_NAMES`)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        for name in _JSON:
            if name in out:
                out[name] = json.dumps(out[name])
        return to_stored(out)

    @classmethod
    def from_dict(cls, attrs: JsonObject, *, source: str) -> BagProvenance:
        """Read back from a bag's root attributes (other attributes are ignored); ConfigError if one
        of ours lacks a field or holds a value of the wrong type."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in from_stored(attrs).items() if k in known}
        for name in _JSON:
            text = data.get(name)
            if isinstance(text, str):
                with contextlib.suppress(ValueError, RecursionError):  # else parse_config names the field
                    data[name] = json.loads(text)
        return parse_config(cls, data, source=source, shown=STORED_NAMES)

"""What a tile file says about its slide and its tiles, typed (as `BagProvenance` is for bags).

The HDF5 file keeps one flat root attribute per value (the layout in docs/architecture.md, format 1
unchanged): `TileFileMeta.to_attrs()` writes exactly those names and `from_attrs()` reads them back,
checking every type, so the tile stage, resume checks, `wsi embed` and `wsi info` share one record
instead of a dict whose keys each reader must know. Sections added by later versions (background
choice, undecodable parts, ROI, segmentation models, review, the slide's fingerprint) are None when a
file predates them, and the artifact counts are 0: files written by earlier mains still load.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Annotated

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from wsi.core.config import MAX_MPP, MIN_TARGET_MPP, Count, Mpp, SidePx, Um, config_model, parse_config
from wsi.core.errors import ConfigError
from wsi.core.json_types import JsonObject, JsonValue
from wsi.core.user_text import parse_json
from wsi.formats.hdf5 import STORED_NAMES, from_stored, to_stored
from wsi.storage.identity import SlideFingerprint
from wsi.tiling.grid import TileCounts


@config_model
@dataclass(frozen=True)
class BackgroundRecord:
    """The background the tissue finder judged the slide to have, and why (`wsi.tiling.background`)."""

    kind: str  # attribute `background`: bright | dark
    reason: str  # `background_reason`
    choice: str = "auto"  # `background_choice`: what --background asked for


@config_model
@dataclass(frozen=True)
class DamageRecord:
    """Parts of the slide file that could not be decoded (absent from files before they were recorded)."""

    n_thumbnail_unreadable: Count  # undecodable regions of the tissue thumbnail
    n_file_tiles_unreadable: Count  # the file's own stored tiles that failed to decode
    n_file_tiles_tissue: Count  # of the file's stored tiles, those under tissue
    #: [[x, y, w, h, level], ...] in level-0 px (attribute `unreadable_regions`, JSON)
    regions: tuple[tuple[Count, ...], ...] = ()


@config_model
@dataclass(frozen=True)
class RoiRecord:
    """The QuPath region of interest the tiles were restricted to (`wsi tile --roi`)."""

    path: str  # `roi_path`
    sha256: str  # `roi_sha256`: a changed file re-tiles the slide
    rule: str  # `roi_rule`: which tiles an ROI keeps (their centre inside)
    n_included: Count  # `n_roi_included`: include polygons
    n_excluded: Count  # `n_roi_excluded`: exclude polygons
    n_outside: Count  # `n_outside_roi`: tissue tiles left out
    #: `roi_note`: what is wrong with where it lies on the slide (beyond it, or drawn in micrometres)
    note: str = ""


@config_model
@dataclass(frozen=True)
class ReviewRecord:
    """The reviewer's verdicts applied over the filters' (`wsi tile --review`, a QuPath export)."""

    path: str  # `review_path`
    sha256: str  # `review_sha256`: a changed file re-applies the review (no slide pixels read)
    n_tiles: Count  # `n_review_tiles`: tile objects of the file matched to this slide's candidates
    n_regions: Count  # `n_review_regions`: Exclude polygons
    n_restored: Count  # `n_review_restored`: tiles the filters rejected, kept by the review
    n_dropped: Count  # `n_review_dropped`: tiles the filters kept, dropped by the review


#: an area on a slide, mm^2 (a 10 x 10 cm square, beyond any glass)
Mm2 = Annotated[float, Field(ge=0, le=1e4)]


@config_model
@dataclass(frozen=True)
class MaskRecord:
    """The tissue mask's area and the coloured area it left out, by why (`wsi.tiling.tissue.LeftOut`)."""

    tissue_mm2: Mm2  # `mask_tissue_mm2`
    glass_mm2: Mm2  # `outside_glass_mm2`: under the saturation split
    ink_mm2: Mm2  # `outside_ink_mm2`: marker or dye colours
    debris_mm2: Mm2  # `outside_debris_mm2`: removed by the cleanup as too small or thin


#: a tile file's attributes as written: one number or text each (mappings as JSON text)
TileFileAttrs = dict[str, str | int | float]


@with_config(ConfigDict(extra="allow"))  # keys a later version adds survive a read and re-write
class SegmentationModel(TypedDict, total=False):
    """One segmentation network as a tile file records it (`models.segmentation.Segmenter.describe`)."""

    name: str
    weights: str  # the weights file as given
    sha256: str
    mpp: float  # um/px the network reads at
    max_artifact_fraction: float  # the artifact network: a tile with more is removed


@with_config(ConfigDict(extra="allow"))
class SegmentationModels(TypedDict, total=False):
    tissue: SegmentationModel
    artifact: SegmentationModel


@config_model
@dataclass(frozen=True)
class SegmentationRecord:
    """The segmentation networks that found tissue or artifacts (name, weights, sha256, mpp)."""

    models: SegmentationModels  # attribute `segmentation` (JSON)
    n_artifact: Count | None = None  # tiles the artifact network removed (None: no artifact network)
    artifact_counts: dict[str, Count] | None = None  # per class ("artifact: pen" -> n), JSON


@config_model
@dataclass(frozen=True)
class TileFileMeta:
    """Every root attribute of a tile file (besides `format`, `format_version` and `complete`)."""

    slide_id: str
    slide_path: str
    tile_um: Um  # tile side, micrometres
    tile_px: SidePx  # tile side as read, px (tile_um / target_mpp)
    mpp: Mpp  # the slide's level-0 um/px
    target_mpp: Mpp  # um/px of the tiles as read
    level0_width: SidePx
    level0_height: SidePx
    backend: str  # openslide | tiffslide | dicom ...
    vendor: str
    #: the TileParams the tiles were cut with (attribute `params`, JSON), as the version that cut them wrote
    #: it: compared whole with a re-run's, parsed with `parse_config(TileParams, ...)` where read
    params: JsonObject
    counts: TileCounts  # n_grid, n_tissue, n_background, ... (one attribute each)
    wsi_version: str
    mpp_source: str = ""  # metadata | --mpp | slide list | --mpp-override ("" before it was recorded)
    background: BackgroundRecord | None = None
    #: why no tile was kept ("" when some were; None: a version that did not say)
    empty_reason: str | None = None
    low_yield: str = ""  # the warning for a slide that kept few tiles
    # > 1 when the scan is coarser than the tiles asked for (slide mpp / tile mpp)
    upsampling: Annotated[float, Field(ge=1, le=MAX_MPP / MIN_TARGET_MPP)] = 1.0
    damage: DamageRecord | None = None
    roi: RoiRecord | None = None
    segmentation: SegmentationRecord | None = None
    review: ReviewRecord | None = None
    mask: MaskRecord | None = None
    #: tiles the filters rejected as ink, by the marker colour of most of their ink (attribute
    #: `ink_colours`, JSON; "unknown": too little of a colour to name); None: not recorded
    ink_colours: dict[str, Count] | None = None
    #: the slide file's size, version and header hash when it was tiled (`wsi.storage.identity`):
    #: a re-run skips the slide only while the file is the same (None: written before it was recorded)
    fingerprint: SlideFingerprint | None = None

    # ------------------------------------------------------------------------------------- writing
    def to_attrs(self) -> TileFileAttrs:
        """The flat root attributes, as stored (mappings as sorted-key JSON, absent sections left out; the
        tile side under its stored names `tile_size_um`, `tile_size_px`)."""
        top = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _SECTIONS}
        out: TileFileAttrs = to_stored(top)
        out["params"] = json.dumps(self.params, sort_keys=True)
        out.update({k: int(v) for k, v in asdict(self.counts).items()})
        if self.empty_reason is None:
            del out["empty_reason"]
        if self.background is not None:
            b = self.background
            out.update(background=b.kind, background_reason=b.reason, background_choice=b.choice)
        if self.damage is not None:
            d = self.damage
            out.update(
                n_thumbnail_unreadable=d.n_thumbnail_unreadable,
                n_file_tiles_unreadable=d.n_file_tiles_unreadable,
                n_file_tiles_tissue=d.n_file_tiles_tissue,
                unreadable_regions=json.dumps([list(r) for r in d.regions]),
            )
        if self.roi is not None:
            r = self.roi
            out.update(
                roi_path=r.path, roi_sha256=r.sha256, roi_rule=r.rule, n_roi_included=r.n_included,
                n_roi_excluded=r.n_excluded, n_outside_roi=r.n_outside, roi_note=r.note,
            )  # fmt: skip
        if self.review is not None:
            v = self.review
            out.update(
                review_path=v.path, review_sha256=v.sha256, n_review_tiles=v.n_tiles,
                n_review_regions=v.n_regions, n_review_restored=v.n_restored, n_review_dropped=v.n_dropped,
            )  # fmt: skip
        if self.mask is not None:
            m = self.mask
            out.update(
                mask_tissue_mm2=m.tissue_mm2, outside_glass_mm2=m.glass_mm2, outside_ink_mm2=m.ink_mm2,
                outside_debris_mm2=m.debris_mm2,
            )  # fmt: skip
        if self.ink_colours is not None:
            out["ink_colours"] = json.dumps(self.ink_colours, sort_keys=True)
        if self.fingerprint is not None:
            out.update(self.fingerprint.as_attrs())
        if self.segmentation is not None:
            s = self.segmentation
            out["segmentation"] = json.dumps(s.models, sort_keys=True)
            if s.n_artifact is not None:
                out["n_artifact"] = s.n_artifact
            if s.artifact_counts is not None:
                out["artifact_counts"] = json.dumps(s.artifact_counts, sort_keys=True)
        return out

    # ------------------------------------------------------------------------------------- reading
    @classmethod
    def from_attrs(cls, attrs: JsonObject, *, source: str) -> TileFileMeta:
        """Read back from a file's root attributes; ConfigError naming `source` and every missing or
        mistyped value. Attributes this version does not know are ignored."""
        missing = [name for name in _REQUIRED_COUNTS if name not in attrs]
        if missing:
            raise ConfigError(f"{source}: tile-file attributes missing: {', '.join(missing)}")
        top = {f.name for f in fields(cls)} - _SECTIONS
        data: dict[str, object] = {k: v for k, v in from_stored(attrs).items() if k in top}
        data["params"] = _json(attrs.get("params"), "params", source)
        data["counts"] = {k: attrs[k] for k in _COUNT_NAMES if k in attrs}
        if "background" in attrs:
            data["background"] = {
                "kind": attrs["background"], "reason": attrs.get("background_reason", ""),
                "choice": attrs.get("background_choice", "auto"),
            }  # fmt: skip
        if "n_thumbnail_unreadable" in attrs:
            data["damage"] = {
                "n_thumbnail_unreadable": attrs["n_thumbnail_unreadable"],
                "n_file_tiles_unreadable": attrs.get("n_file_tiles_unreadable", 0),
                "n_file_tiles_tissue": attrs.get("n_file_tiles_tissue", 0),
                "regions": _json(attrs.get("unreadable_regions", "[]"), "unreadable_regions", source),
            }
        if "roi_sha256" in attrs:
            data["roi"] = {
                "path": attrs.get("roi_path", ""), "sha256": attrs["roi_sha256"],
                "rule": attrs.get("roi_rule", ""), "n_included": attrs.get("n_roi_included", 0),
                "n_excluded": attrs.get("n_roi_excluded", 0), "n_outside": attrs.get("n_outside_roi", 0),
                "note": attrs.get("roi_note", ""),
            }  # fmt: skip
        if "review_sha256" in attrs:
            data["review"] = {
                "path": attrs.get("review_path", ""), "sha256": attrs["review_sha256"],
                "n_tiles": attrs.get("n_review_tiles", 0), "n_regions": attrs.get("n_review_regions", 0),
                "n_restored": attrs.get("n_review_restored", 0),
                "n_dropped": attrs.get("n_review_dropped", 0),
            }  # fmt: skip
        if "mask_tissue_mm2" in attrs:
            data["mask"] = {
                "tissue_mm2": attrs["mask_tissue_mm2"], "glass_mm2": attrs.get("outside_glass_mm2", 0.0),
                "ink_mm2": attrs.get("outside_ink_mm2", 0.0),
                "debris_mm2": attrs.get("outside_debris_mm2", 0.0),
            }  # fmt: skip
        if "ink_colours" in attrs:
            data["ink_colours"] = _json(attrs["ink_colours"], "ink_colours", source)
        found = SlideFingerprint.from_attrs(dict(attrs))
        if found is not None:
            data["fingerprint"] = found
        if attrs.get("segmentation"):
            data["segmentation"] = {
                "models": _json(attrs["segmentation"], "segmentation", source),
                "n_artifact": attrs.get("n_artifact"),
                "artifact_counts": _json(attrs["artifact_counts"], "artifact_counts", source)
                if "artifact_counts" in attrs
                else None,
            }
        return parse_config(cls, data, source=source, shown=STORED_NAMES)

    # ------------------------------------------------------------------------------------- views
    @property
    def n_kept(self) -> int:
        return self.counts.n_kept

    def segmentation_models(self) -> SegmentationModels:
        """The segmentation networks recorded ({} for tiles made without them)."""
        return self.segmentation.models.copy() if self.segmentation is not None else {}


_SECTIONS = {
    "counts", "background", "damage", "roi", "segmentation", "review", "mask", "ink_colours", "fingerprint"
}
_COUNT_NAMES = tuple(f.name for f in fields(TileCounts))
#: counts every version wrote (the artifact and unreadable counts came later: 0 when absent)
_REQUIRED_COUNTS = ("n_grid", "n_tissue", "n_background", "n_blurry", "n_kept")
#: attributes every tile file carries (besides `format`, `format_version`, `complete`): the fields
#: without a default, and the counts
REQUIRED_ATTRS = (
    *to_stored({f.name: 0 for f in fields(TileFileMeta) if f.name not in _SECTIONS and f.default is MISSING}),
    *_REQUIRED_COUNTS,
)


def _json(value: JsonValue, name: str, source: str) -> JsonValue:
    if not isinstance(value, str):
        return value  # a mapping given directly (or a wrong type, which parse_config names)
    return parse_json(value, f"{source}: attribute `{name}`")


__all__ = [
    "REQUIRED_ATTRS",
    "BackgroundRecord",
    "DamageRecord",
    "MaskRecord",
    "ReviewRecord",
    "RoiRecord",
    "SegmentationModel",
    "SegmentationModels",
    "SegmentationRecord",
    "TileFileAttrs",
    "TileFileMeta",
]

"""What a slide's tiling found worth telling the user, as typed fields; the manifest note is their words.

A slide that keeps under LOW_YIELD of its tissue tiles is "ok" but not what the user asked for
(`LowYield`: the filter that removed most, and its option); one filter that removes more than
HEAVY_FILTER of a slide's tissue is worth a look before trusting it (`HeavyFilters`: it may have taken
blood and eosin for red ink). HEAVY_FILTER (5%) is a constant, not an option: it changes no tile, only
when the user is asked to look. Blur counts (blurry tiles are tissue: out-of-focus bands, or smooth
tissue such as fat or mucus judged blurry); background does not (a background tile is mostly glass, and
tissue edges give 10-30% of them on most slides). Undecodable tiles have their own note
(`pipelines.tile.checks.damage_note`).

The command's summary prints from these fields (`TileSlideResult.findings`), never from the note text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wsi.formats.tile_meta import TileFileMeta
from wsi.pipelines.scheduling.results import JobResult, StageResult, Status
from wsi.pipelines.tile.artifacts import artifact_counts_by_name, artifact_note
from wsi.slides.region import LEVEL_TOLERANCE
from wsi.tiling.artifacts.regions import REGION_MPP
from wsi.tiling.grid import TileCounts
from wsi.tiling.params import ArtifactParams, TileParams
from wsi.tiling.tissue import LeftOut

#: a slide keeping under this share of its tissue tiles gets a note
LOW_YIELD = 0.10
#: one filter removing more than this share of a slide's tissue tiles is named (see the module docstring)
HEAVY_FILTER = 0.05
#: the coloured area the tissue mask left out is noted from this share of the tissue on ...
MASK_NOTE_SHARE = 0.01
#: ... and asked to be looked at from this share of it judged glass (pale tissue under the split)
MASK_CHECK_SHARE = 0.05
#: the artifact filters judge a slide read coarser than this (um/px: 1.25x the REGION_MPP they run at)
#: with a note: HistoQC's red pen image resampled from 16 to 20, 24 and 40 um/px keeps 5.8%, 16% and
#: 21% of its red-inked tiles against 2.6% at 16 (docs/benchmarks.md, "Red marker at 40 um/px")
COARSE_FILTERS_MPP = 1.25 * REGION_MPP
#: the settings of a tile file that stores none (the defaults)
DEFAULTS = TileParams()


@dataclass(frozen=True)
class FilterShare:
    """Tissue tiles one filter removed from a slide, and the option that controls that filter."""

    name: str  # "blurry", "background", "unreadable", "review", a weight-free filter ("ink"), "artifact: pen"
    removed: int
    tissue: int
    option: str

    @property
    def share(self) -> float:
        return self.removed / self.tissue if self.tissue else 0.0


@dataclass(frozen=True)
class LowYield:
    """A slide that kept some, but under LOW_YIELD, of its tissue tiles; `worst` removed most."""

    kept: int
    tissue: int
    worst: FilterShare

    def text(self) -> str:
        share = self.kept / self.tissue
        return (
            f"low yield: kept {self.kept} of {self.tissue} tissue tiles ({share:.1%}, under "
            f"{LOW_YIELD:.0%}); most removed as {self.worst.name} ({self.worst.removed}); "
            f"option: {self.worst.option}"
        )


@dataclass(frozen=True)
class OutsideMask:
    """Coloured area the tissue mask left out (`wsi.tiling.tissue.LeftOut`), from MASK_NOTE_SHARE of the
    tissue on; `check`: so much of it judged glass (MASK_CHECK_SHARE) that pale tissue may be missing."""

    slide_id: str
    left: LeftOut

    @property
    def check(self) -> bool:
        return self.left.share(self.left.glass_mm2) >= MASK_CHECK_SHARE

    def text(self) -> str:
        note = f"outside the tissue mask: {self.left.describe()}"
        if self.check:
            note += f"; check qc/{self.slide_id}.png: pale tissue may have been taken for glass"
        return note


def outside_mask(meta: TileFileMeta) -> OutsideMask | None:
    """The tile file's mask record as a finding (None: under MASK_NOTE_SHARE, or not recorded)."""
    m = meta.mask
    if m is None:
        return None
    left = LeftOut(m.tissue_mm2, m.glass_mm2, m.ink_mm2, m.debris_mm2)
    return OutsideMask(meta.slide_id, left) if left.share(left.total_mm2) >= MASK_NOTE_SHARE else None


@dataclass(frozen=True)
class HeavyFilters:
    """Filters that each removed more than HEAVY_FILTER of a slide's tissue tiles."""

    slide_id: str
    filters: tuple[FilterShare, ...]

    def text(self) -> str:
        n = self.filters[0].tissue
        shares = ", ".join(f"{f.name} removed {f.share:.1%} ({f.removed} of {n})" for f in self.filters)
        options = "; ".join(f.option for f in self.filters)
        return (
            f"check filter: {shares} of the tissue tiles (over {HEAVY_FILTER:.0%}); look at "
            f"qc/{self.slide_id}.png, or qc/{self.slide_id}.geojson in QuPath; if it took tissue: {options}, "
            "or re-class tiles in QuPath and pass the export back with --review"
        )


def _option(name: str, min_blur_variance: float, max_background: float, max_artifact: float | None) -> str:
    """The option that controls the filter `name`."""
    if name.startswith("artifact"):
        return f"--max-artifact {max_artifact or 0:g} (raise it) or leave out --artifact-model"
    fixed = {
        "review": "the --review file (tiles it classes other than kept, or inside Exclude regions)",
        "blurry": f"--min-blur-var {min_blur_variance:g} (lower it; 0 turns the blur filter off)",
        "background": f"--max-background {max_background:g} (raise it) or --white-level",
        "unreadable": "none: the slide file is damaged",
    }
    return fixed.get(name, f"--no-filter {name}")


def rejections(counts: TileCounts, artifact_counts: Mapping[str, int]) -> dict[str, int]:
    """Tiles removed per filter: blurry, background, unreadable, review and each artifact (weight-free
    filters by name, the artifact network's classes as "artifact: pen")."""
    out = {"blurry": counts.n_blurry, "background": counts.n_background, "unreadable": counts.n_unreadable}
    out.update({name: int(n) for name, n in artifact_counts.items()})
    if counts.n_excluded:
        out["review"] = counts.n_excluded
    return out


def low_yield(
    counts: TileCounts,
    *,
    min_blur_variance: float,
    max_background: float,
    artifact_counts: Mapping[str, int] | None = None,
    max_artifact: float | None = None,
) -> LowYield | None:
    """The finding for a slide that keeps some but under LOW_YIELD of its tissue tiles (None otherwise:
    an empty slide has its own reason)."""
    if counts.n_tissue == 0 or counts.n_kept == 0 or counts.n_kept >= LOW_YIELD * counts.n_tissue:
        return None
    removed = rejections(counts, artifact_counts or {})
    name = max(removed, key=lambda k: removed[k])
    option = _option(name, min_blur_variance, max_background, max_artifact)
    return LowYield(counts.n_kept, counts.n_tissue, FilterShare(name, removed[name], counts.n_tissue, option))


def heavy_filters(
    counts: TileCounts,
    artifact_counts: Mapping[str, int],
    slide_id: str,
    *,
    min_blur_variance: float,
    max_artifact: float | None = None,
) -> HeavyFilters | None:
    """The filters (blur and every artifact filter; never background) that each removed more than
    HEAVY_FILTER of the tissue tiles, or None."""
    n = counts.n_tissue
    removed = {"blurry": counts.n_blurry, **{name: int(k) for name, k in artifact_counts.items()}}
    heavy = tuple(
        FilterShare(name, k, n, _option(name, min_blur_variance, 0.0, max_artifact))
        for name, k in removed.items()
        if n and k > HEAVY_FILTER * n
    )
    return HeavyFilters(slide_id, heavy) if heavy else None


def upsampling_note(slide_mpp: float, target_mpp: float) -> tuple[float, str]:
    """(factor, note): how many times each tile is enlarged from the slide's finest level (1.0: not)."""
    factor = slide_mpp / target_mpp
    if factor <= 1.0 + LEVEL_TOLERANCE:
        return 1.0, ""
    return factor, (
        f"scanned at {slide_mpp:.3g} um/px, coarser than the tiles' {target_mpp:.3g} um/px: every tile is "
        f"upsampled {factor:.2g}x (no detail is added; blur is judged at the scan's own resolution)"
    )


def coarse_filters_note(thumb_mpp: float, params: ArtifactParams, *, ran: bool) -> str:
    """A note ("" if none) when the ink filter looked for red marker on a thumbnail coarser than
    COARSE_FILTERS_MPP (a plain image or a slide with no finer level): there, red marker over tissue
    absorbs as blood does in a pixel that mixes both, and it is kept more often."""
    if not ran or thumb_mpp <= COARSE_FILTERS_MPP or not params.on("ink") or "red" not in params.ink_colours:
        return ""
    return (
        f"the artifact filters could judge this slide only at {thumb_mpp:.3g} um/px, coarser than the "
        f"{REGION_MPP:g} um/px they were chosen at: red marker over tissue is told from blood less well "
        "there and may be kept (check the QC picture; an image at 16 um/px or finer avoids it)"
    )


def artifact_empty(
    counts: TileCounts, artifact_counts: Mapping[str, int], model: str, max_artifact: float
) -> str:
    """Why a slide kept no tile when the artifact model removed most of them ("" when another filter did)."""
    removed = rejections(counts, artifact_counts)
    worst = max(removed, key=lambda k: removed[k])
    if not worst.startswith("artifact") or counts.n_kept:
        return ""
    n_artifact = sum(artifact_counts.values())
    return (
        f"no tile kept: {n_artifact} of {counts.n_tissue} tissue tiles rejected by the artifact model "
        f"{model}, most as {worst.removeprefix('artifact: ')} ({removed[worst]}): raise --max-artifact "
        f"{max_artifact:g} or leave out --artifact-model"
    )


@dataclass(frozen=True)
class TileFindings:
    """What one slide's tile file records that a user should hear about."""

    counts: TileCounts
    artifacts: dict[str, int]  # tiles removed per artifact filter ("ink") and artifact-model class
    low_yield: LowYield | None
    heavy: HeavyFilters | None
    upsampling: str  # the coarse-scan note when the slide kept few tiles ("" otherwise)
    review: str  # what a --review file changed ("" without one)
    roi: str  # what is wrong with the ROI's place ("" when nothing)
    ink_colours: dict[str, int] = field(default_factory=dict)  # ink tiles per marker colour
    outside_mask: OutsideMask | None = None  # coloured area the tissue mask left out

    def note(self) -> str:
        """The manifest's note: the findings' words joined by "; " ("" when there is nothing to say)."""
        few = "; ".join(p for p in (self.low_yield.text() if self.low_yield else "", self.upsampling) if p)
        heavy = self.heavy.text() if self.heavy else ""
        mask = self.outside_mask.text() if self.outside_mask else ""
        artifacts = artifact_note(self.counts.to_dict(), self.ink_colours)
        parts = (artifacts, few, heavy, self.review, self.roi, mask)
        return "; ".join(part for part in parts if part)


def findings_of(meta: TileFileMeta) -> TileFindings:
    """A finished tile file's findings (every path that returns a slide's row: tiled, reviewed, skipped)."""
    counts = meta.counts
    seg = meta.segmentation
    by_name = {k: v for k, v in artifact_counts_by_name(counts.to_dict()).items() if v}
    by_name.update((seg.artifact_counts or {}) if seg is not None else {})
    model = (seg.models.get("artifact") or {}) if seg is not None else {}
    max_artifact = model.get("max_artifact_fraction")
    blur = _setting(meta, "min_blur_variance", DEFAULTS.min_blur_variance)
    background = _setting(meta, "max_background_fraction", DEFAULTS.max_background_fraction)
    few = low_yield(counts, min_blur_variance=blur, max_background=background, artifact_counts=by_name,
                    max_artifact=max_artifact)  # fmt: skip
    review = ""
    if meta.review is not None:
        r = meta.review
        review = (
            f"reviewed ({Path(r.path).name}): {r.n_restored} rejected tile(s) kept, {r.n_dropped} kept "
            f"tile(s) dropped ({r.n_tiles} tile objects, {r.n_regions} Exclude region(s))"
        )
    coarse = upsampling_note(meta.mpp, meta.target_mpp)[1] if few is not None else ""
    return TileFindings(
        counts=counts,
        artifacts=by_name,
        low_yield=few,
        heavy=heavy_filters(
            counts, by_name, meta.slide_id, min_blur_variance=blur, max_artifact=max_artifact
        ),
        upsampling=coarse,
        review=review,
        roi=meta.roi.note if meta.roi is not None else "",
        ink_colours=dict(meta.ink_colours or {}),
        outside_mask=outside_mask(meta),
    )


def _setting(meta: TileFileMeta, name: str, default: float) -> float:
    """A number of the TileParams stored in the tile file (any version's JSON)."""
    value = meta.params.get(name)
    return float(value) if isinstance(value, int | float) else default


@dataclass
class TileSlideResult(JobResult):
    """One slide's row of the tile stage: the common fields, and what its tiling found (None when it did
    not get as far as a tile file)."""

    findings: TileFindings | None = None

    @classmethod
    def of(
        cls, slide_id: str, path: str, status: Status, meta: TileFileMeta, *, n: int, error: str = ""
    ) -> TileSlideResult:
        found = findings_of(meta)
        return cls(slide_id, path, status, n=n, error=error, note=found.note(), findings=found)

    @classmethod
    def row(cls, result: JobResult) -> TileSlideResult:
        """`result` as a tile row (a job that raised is a plain failed JobResult: no findings)."""
        return result if isinstance(result, cls) else cls(**asdict(result))


#: what `tile_slides` returns: one TileSlideResult per slide, in input order
TileResult = StageResult[TileSlideResult]


__all__ = [
    "HEAVY_FILTER",
    "LOW_YIELD",
    "FilterShare",
    "HeavyFilters",
    "LowYield",
    "OutsideMask",
    "TileFindings",
    "TileResult",
    "TileSlideResult",
    "artifact_empty",
    "findings_of",
    "heavy_filters",
    "low_yield",
    "outside_mask",
    "rejections",
    "upsampling_note",
]

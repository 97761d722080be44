"""Physical tile grid, tissue fraction per cell, and the background / blur filters on tile pixels.

`TileParams` holds every setting (a `wsi.core.config` model); `find_tissue(slide, params)` gives the grid
cells worth reading; `classify_tiles(tiles, params)` the fate of each read tile; `TileCounts` the tally.
A dark-background (fluorescence-like) slide is found from its thumbnail (`wsi.tiling.background`) and measured
the way that fits it (`dark=True`): no setting changes, so the stored settings stay those of the run.

The grid is laid out in micrometres (cell i starts at i * tile_um) and converted to level-0 pixels
with the slide's MPP, so one scene scanned at 0.25 and at 0.5 um/px gives the same grid in um.
Filters run on the tile at its target resolution (tile_um / tile_px um/px), the pixels an encoder sees.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from wsi.core.work_bounds import check_grid, grid_shape
from wsi.slides.region import LEVEL_TOLERANCE
from wsi.slides.thumbnail import Thumbnail, read_thumbnails
from wsi.tiling.artifacts import CODES, ArtifactMaps, artifact_verdicts, find_artifacts, judge_tiles
from wsi.tiling.background import (
    Background,
    detect_background,
    looks_dark_maybe,
    with_glass_level,
    with_signal_gain,
)
from wsi.tiling.blur import (
    BLUR_BATCH,
    background_fraction,
    block_median_variance,
    dark_inputs,
    light_inputs,
    max_rgb,
    min_rgb,
    source_blocks,
)
from wsi.tiling.dark_noise import dark_noise, tile_signal_level
from wsi.tiling.filter_bounds import surely_kept
from wsi.tiling.params import ArtifactParams, TileParams
from wsi.tiling.tissue import LeftOut, cell_fractions, find_tissue_mask, left_out

if TYPE_CHECKING:
    from wsi.slides.slide import Slide
    from wsi.slides.tiff_tiles import UnreadableRegion


@dataclass(frozen=True)
class Grid:
    """Full grid cells of one slide, row-major."""

    coords: np.ndarray  # (N, 2) int64 top-left (x, y) in level-0 pixels
    coords_um: np.ndarray  # (N, 2) float32 top-left (x, y) in micrometres
    step_px: float  # tile side in level-0 pixels (tile_um / mpp, not rounded)
    n_cols: int
    n_rows: int

    def __len__(self) -> int:
        return len(self.coords)


def make_grid(width_px: int, height_px: int, *, mpp: float, tile_um: float) -> Grid:
    """Every whole tile of `tile_um` that fits in a level-0 image of width_px x height_px at `mpp`.
    Its arrays grow with the grid: bound it with `check_grid` first (`find_tissue` and the tile stage
    do, once per slide, before anything is read)."""
    if not mpp > 0:
        raise ValueError(f"mpp must be positive, got {mpp}")
    step_px = tile_um / mpp
    n_cols, n_rows = grid_shape(width_px, height_px, mpp=mpp, tile_um=tile_um)
    rows, cols = np.meshgrid(np.arange(n_rows), np.arange(n_cols), indexing="ij")
    index = np.stack([cols.ravel(), rows.ravel()], axis=1)  # (N, 2) as (col, row)
    coords_um = (index * tile_um).astype(np.float32)
    coords = np.floor(index * step_px + 0.5).astype(np.int64)
    return Grid(coords=coords, coords_um=coords_um, step_px=step_px, n_cols=n_cols, n_rows=n_rows)


def tissue_fractions(grid: Grid, mask: np.ndarray, *, level0_width: int, level0_height: int) -> np.ndarray:
    """(N,) fraction of each grid cell covered by the (H, W) mask of the whole slide."""
    if len(grid) == 0:
        return np.zeros(0)
    boxes = cell_boxes(grid, mask.shape, level0_width=level0_width, level0_height=level0_height)
    return cell_fractions(mask, boxes)


def cell_boxes(grid: Grid, shape: tuple[int, ...], *, level0_width: int, level0_height: int) -> np.ndarray:
    """(N, 4) float (x0, y0, x1, y1) of each grid cell in the pixels of an (H, W) image of the slide."""
    sx = shape[1] / level0_width  # image pixels per level-0 pixel
    sy = shape[0] / level0_height
    x0 = grid.coords[:, 0].astype(np.float64)
    y0 = grid.coords[:, 1].astype(np.float64)
    boxes = np.stack([x0 * sx, y0 * sy, (x0 + grid.step_px) * sx, (y0 + grid.step_px) * sy], axis=1)
    return boxes.reshape(-1, 4)


@dataclass(frozen=True)
class TissueGrid:
    """Where the tissue is: the thumbnail, its mask, the slide's grid and the cells worth reading."""

    thumb: np.ndarray  # (h, w, 3) uint8 thumbnail at about params.tissue.thumb_mpp
    mask: np.ndarray  # (h, w) bool tissue mask of the thumbnail
    grid: Grid  # every whole tile of the slide, level-0 and micrometre coordinates
    candidates: np.ndarray  # (M,) int64 indices into grid: cells with enough tissue (or unknown) to be read
    background: Background = field(default_factory=lambda: Background("light", "not checked"))
    #: (h, w) bool: parts of the thumbnail that could not be decoded (None: all of it was read)
    unknown: np.ndarray | None = None
    #: where the thumbnail could not be decoded, level-0 px (`wsi.slides.thumbnail.Thumbnail.unreadable`)
    unreadable: tuple[UnreadableRegion, ...] = ()
    #: the artifact filters' regions on the thumbnail (empty: none ran, e.g. a dark-background slide)
    artifacts: ArtifactMaps = field(default_factory=ArtifactMaps)
    #: (M,) int8 artifact reason code per candidate from its share of each region (0: none), or None
    region_codes: np.ndarray | None = None
    #: (M,) uint8 the ink colour covering most of each candidate on the thumbnail (`wsi.tiling.artifacts.
    #: colour_code`; 0: none), or None where the ink filter did not run
    region_colours: np.ndarray | None = None
    #: (N,) each grid cell's share of `mask` (with `unknown`: of both), or None where not computed
    fractions: np.ndarray | None = None
    #: coloured area the mask left out, and why (`wsi.tiling.tissue.left_out`); None: not counted (a mask
    #: given by a network, a dark-background slide)
    left_out: LeftOut | None = None

    def restricted(self, keep: np.ndarray) -> TissueGrid:
        """The same grid with only the candidates where (M,) bool `keep` (an ROI, an artifact network's
        verdicts), their per-candidate regions' codes and ink colours with them."""
        codes = self.region_codes[keep] if self.region_codes is not None else None
        colours = self.region_colours[keep] if self.region_colours is not None else None
        return dataclasses.replace(
            self, candidates=self.candidates[keep], region_codes=codes, region_colours=colours
        )

    @property
    def candidate_coords(self) -> np.ndarray:
        """(M, 2) int64 level-0 top-left of each candidate cell."""
        return self.grid.coords[self.candidates]


def find_tissue(
    slide: Slide,
    params: TileParams,
    *,
    background: str = "auto",
    thumbnail: Thumbnail | None = None,
    mask: np.ndarray | None = None,
    own_pixels: np.ndarray | None = None,
) -> TissueGrid:
    """Thumbnail -> light or dark background -> tissue mask -> physical grid -> the cells at least
    min_tissue_fraction tissue. background: "auto" (detect, `wsi.tiling.background`), "light" or "dark".

    thumbnail: the slide at about params.tissue.thumb_mpp, when the caller read it already (the tile
    stage reads it with its QC picture, `wsi.slides.thumbnail.read_thumbnails`, after bounding the grid
    with `check_grid`). What of it could not be
    decoded is unknown, not background: it takes no part in telling light from dark nor in the mask's
    threshold (it is painted the background's colour), and counts as tissue for the cells' fractions, so a
    cell with a hole at the tissue edge is still tried (and its tiles counted unreadable when they fail).
    mask: a tissue mask at the thumbnail's size found otherwise (a segmentation network), used as it is.
    own_pixels: the slide's level 0 as read, where it is coarser than the thumbnail (an enlarged thumbnail
    adds no detail): the artifact filters judge it (`_artifacts_at_own_pixels`).
    """
    w0, h0 = slide.dimensions
    if thumbnail is None:  # a caller that read the thumbnail bounded the grid before it did
        check_grid(slide.path, w0, h0, mpp=slide.mpp, tile_um=params.tile_um)
        # with the slide's own pixels where it is coarser than the thumbnail (read once: the same level)
        coarse = coarser_than(slide.mpp, params.tissue.thumb_mpp)
        read = read_thumbnails(slide, (params.tissue.thumb_mpp, *((slide.mpp,) if coarse else ())))
        thumbnail = read[0]
        if coarse and own_pixels is None:
            own_pixels = read_pixels(read[1])
    thumb = thumbnail
    image, unknown = thumb.image, thumb.unknown
    known = image[~unknown][None] if unknown.any() else image  # (1, n, 3): only pixels that were read
    kind = detect_background(known, slide.properties, choice=background)
    if unknown.any():
        image = image.copy()
        image[unknown] = 0 if kind.dark else 255  # as the background looks: neither tissue nor a vote
    missed = None
    if mask is None:
        finding = find_tissue_mask(image, mpp=thumb.mpp, params=params.tissue, dark=kind.dark)
        mask = finding.mask
        if not kind.dark:
            missed = left_out(image, finding, mpp=thumb.mpp, params=params.tissue)
    elif mask.shape != image.shape[:2]:
        raise ValueError(f"tissue mask of shape {mask.shape} for a thumbnail of {image.shape[:2]}")
    if kind.dark:
        kind = with_signal_gain(with_noise_level(kind, image, mask, params), image, mask)
    else:
        kind = with_glass_level(
            kind, image, mask, params.white_level, known=~unknown if unknown.any() else None
        )
    grid = make_grid(w0, h0, mpp=slide.mpp, tile_um=params.tile_um)
    maybe = mask | unknown  # unknown: maybe tissue, to be tried
    fractions = tissue_fractions(grid, maybe, level0_width=w0, level0_height=h0)
    candidates = np.flatnonzero(fractions >= params.min_tissue_fraction)
    maps, codes, colours = ArtifactMaps(), None, None
    # colour rules are for brightfield; a slide taken as light that looks like a dark-background one
    # (`--background light` on fluorescence) would be all "black ink": its message says what to do
    if not kind.dark and not looks_dark_maybe(kind) and params.artifacts.filters:
        maps = _artifacts_at_own_pixels(image, mask, thumb.mpp, slide.mpp, params.artifacts, own_pixels)
        boxes = cell_boxes(grid, mask.shape, level0_width=w0, level0_height=h0)[candidates]
        codes = artifact_verdicts(maps.shares(boxes), params.artifacts, tissue=fractions[candidates])
        colours = maps.colours(boxes) if params.artifacts.on("ink") else None
    return TissueGrid(
        thumb=image, mask=mask, grid=grid, candidates=candidates, background=kind,
        unknown=unknown if unknown.any() else None, unreadable=thumb.unreadable, artifacts=maps,
        region_codes=codes, region_colours=colours, fractions=fractions, left_out=missed,
    )  # fmt: skip


def with_noise_level(kind: Background, thumb: np.ndarray, mask: np.ndarray, params: TileParams) -> Background:
    """A dark slide's `kind` with the tile pixels' signal level from its background noise
    (`wsi.tiling.dark_noise`): a dim scan's tissue is not "background" to the tile filter just because it is
    under 255 - white_level."""
    high = max_rgb(thumb)
    noise = dark_noise(high[~mask] if (~mask).any() else high, k=params.tissue.dark_noise_sigmas)
    ceiling = 255 - params.white_level
    tissue_level = float(np.median(high[mask])) if mask.any() else float(ceiling)
    level = tile_signal_level(noise, tissue_level, ceiling=ceiling)
    if level >= ceiling:
        return kind
    reason = f"{kind.reason}; dim: {noise.describe()}, tile pixels above {level} count as signal"
    return dataclasses.replace(kind, signal_level=level, reason=reason)


def coarser_than(slide_mpp: float, thumb_mpp: float) -> bool:
    """Whether a slide's own pixels are coarser than its thumbnail (which is then an enlargement, and the
    artifact filters judge the slide's own pixels instead: `find_tissue`'s own_pixels)."""
    return slide_mpp > thumb_mpp * (1.0 + LEVEL_TOLERANCE)


def read_pixels(thumb: Thumbnail) -> np.ndarray:
    """A thumbnail's image with what could not be read white (glass: no vote for any filter)."""
    return np.where(thumb.unknown[..., None], np.uint8(255), thumb.image)


def _artifacts_at_own_pixels(
    image: np.ndarray,
    mask: np.ndarray,
    thumb_mpp: float,
    slide_mpp: float,
    params: ArtifactParams,
    own: np.ndarray | None = None,
) -> ArtifactMaps:
    """The artifact filters on the thumbnail, or on the slide's own pixels where they are coarser (`own`,
    level 0 as read; else the thumbnail brought back to its size): the filters were chosen and are measured
    on such images at their own resolution, and an enlarged thumbnail moved HistoQC's red pen image (16
    um/px) from 1.8% to 6.8% of its red-inked tiles kept (docs/benchmarks.md)."""
    if not coarser_than(slide_mpp, thumb_mpp):
        return find_artifacts(image, mask, mpp=thumb_mpp, params=params)
    factor = slide_mpp / thumb_mpp
    h, w = mask.shape
    if own is None:
        size = (max(1, round(w / factor)), max(1, round(h / factor)))
        own = np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BOX))
    size = (own.shape[1], own.shape[0])
    small = Image.fromarray(mask.astype(np.uint8) * 255).resize(size, Image.Resampling.BOX)
    maps = find_artifacts(own, np.asarray(small) >= 128, mpp=thumb_mpp * w / size[0], params=params)
    return dataclasses.replace(maps, scale=maps.scale * size[0] / w)


# reason codes per candidate tile, in the order the filters run; UNREADABLE: its pixels failed to decode;
# the artifact filters' codes follow (wsi.tiling.artifacts.CODES: ink 4, fold 5, bubble 6, border 7, dust 8,
# blood 9)
KEPT, BACKGROUND, BLURRY, UNREADABLE = 0, 1, 2, 3
#: a tile a reviewer dropped (`wsi tile --review`: re-classed in QuPath, or inside an Exclude region); not
#: a filter's verdict, so not in REASON_NAMES (the QC picture and qc/<id>.geojson show the filters')
EXCLUDED = 15
#: every reason code -> its name (tile files count them as n_<name>, the QC picture colours them)
REASON_NAMES: dict[int, str] = {
    KEPT: "kept", BACKGROUND: "background", BLURRY: "blurry", UNREADABLE: "unreadable",
    **{code: name for name, code in CODES.items()},
}  # fmt: skip


def classify_tiles(
    tiles: np.ndarray,
    params: TileParams,
    *,
    dark: bool = False,
    gain: float = 1.0,
    signal_level: int | None = None,
    blur_reduce: int = 1,
) -> np.ndarray:
    """(B,) reason code (KEPT, BACKGROUND or BLURRY) for (B, P, P, 3) uint8 tiles.

    Runs a few tiles at a time through both filters while their pixels are still in the CPU cache
    (measured 1.5x faster than each filter over the whole batch). dark: a dark-background slide, where
    a background pixel is one whose brightest channel is at most 255 - white_level (near black, the
    mirror of near-white glass) and the blur test runs on the brightest channel times the slide's
    `gain` (`dark_inputs`); `signal_level` replaces 255 - white_level on a dim slide
    (`with_noise_level`). blur_reduce: k > 1 for a scan coarser than the tiles (each tile upsampled about
    k x): the blur test runs on k x k block means, i.e. at the scan's own resolution, where an upsampled
    tile's smoothness is not mistaken for blur (`source_blocks`).

    Brightfield tiles proved neither background nor blurry by a bound on a sample of their rows
    (`wsi.tiling.filter_bounds.surely_kept`: most sharp tissue tiles) skip the exact filters; the verdicts are
    the exact filters' either way (`classify_exact`).
    """
    if dark or blur_reduce > 1 or params.min_blur_variance <= 0:
        return classify_exact(
            tiles, params, dark=dark, gain=gain, signal_level=signal_level, blur_reduce=blur_reduce
        )
    sure = surely_kept(
        tiles, white_level=params.white_level, max_background_fraction=params.max_background_fraction,
        min_blur_variance=params.min_blur_variance,
    )  # fmt: skip
    reasons = np.full(len(tiles), KEPT, dtype=np.int8)
    rest = np.flatnonzero(~sure)
    if len(rest):
        reasons[rest] = classify_exact(tiles[rest] if len(rest) < len(tiles) else tiles, params)
    return reasons


def classify_exact(
    tiles: np.ndarray,
    params: TileParams,
    *,
    dark: bool = False,
    gain: float = 1.0,
    signal_level: int | None = None,
    blur_reduce: int = 1,
) -> np.ndarray:
    """`classify_tiles` computed in full on every pixel of every tile (what its shortcut must agree with)."""
    level = 255 - params.white_level if signal_level is None else signal_level
    reasons = np.full(len(tiles), KEPT, dtype=np.int8)
    for start in range(0, len(tiles), BLUR_BATCH):
        part = tiles[start : start + BLUR_BATCH]
        if dark:
            low = max_rgb(part)  # (b, P, P), shared by both filters
            background = np.count_nonzero(low <= level, axis=(1, 2)) / low[0].size
        else:
            low = min_rgb(part)  # (b, P, P), shared by both filters
            background = background_fraction(part, white_level=params.white_level, low=low)
        is_background = background > params.max_background_fraction
        reasons[start : start + len(part)][is_background] = BACKGROUND
        rest = np.flatnonzero(~is_background)
        if params.min_blur_variance <= 0 or len(rest) == 0:
            continue
        if len(rest) < len(part):  # the common case (all left) needs no copy
            part, low = part[rest], low[rest]
        if blur_reduce > 1:
            part = source_blocks(part, blur_reduce)
            low = max_rgb(part) if dark else min_rgb(part)
        if dark:
            gray, fg = dark_inputs(low, params.white_level, gain, signal_level)
        else:
            gray, fg = light_inputs(part, low, params.white_level)
        score = block_median_variance(gray, fg, 4)
        reasons[start + rest[score < params.min_blur_variance]] = BLURRY
    return reasons


def judge_artifacts(
    tiles: np.ndarray,
    reasons: np.ndarray,
    region_codes: np.ndarray | None,
    params: TileParams,
    colours: np.ndarray | None = None,
) -> np.ndarray:
    """`reasons` with the artifacts named (`wsi.tiling.artifacts.judge_tiles`): kept and blurry tiles may
    become one; background and unreadable ones keep their reason. region_codes None: none ran. colours:
    (B,) uint8 each tile's ink colour, its regions' on entry, changed in place where its pixels decide."""
    if region_codes is None:
        return reasons
    open_ = (reasons == KEPT) | (reasons == BLURRY)
    return judge_tiles(tiles, reasons, region_codes, params.artifacts, open_=open_, colours=colours)


@dataclass
class TileCounts:
    """How many grid cells went where.

    n_grid = no tissue + n_tissue, and n_tissue = n_background + n_blurry + n_unreadable + n_kept +
    the artifacts (n_ink + n_fold + n_bubble + n_border + n_dust + n_blood) + n_excluded (dropped by a
    review).
    """

    n_grid: int = 0
    n_tissue: int = 0
    n_background: int = 0
    n_blurry: int = 0
    n_unreadable: int = 0
    n_kept: int = 0
    n_ink: int = 0
    n_fold: int = 0
    n_bubble: int = 0
    n_border: int = 0
    n_dust: int = 0
    n_blood: int = 0
    n_excluded: int = 0

    @property
    def n_artifacts(self) -> int:
        return self.n_ink + self.n_fold + self.n_bubble + self.n_border + self.n_dust + self.n_blood

    def to_dict(self) -> dict[str, int]:
        """Plain ints by name (stored as tile-file attributes)."""
        return {k: int(v) for k, v in asdict(self).items()}

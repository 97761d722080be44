"""Reading a slide's candidate tiles in chunks on a thread pool, for the tile stage and benchmarks.

    read_tile_chunks(slide, coords, params, threads) -> Iterator[(k, P, P, 3) uint8]   # reads only
    classified_chunks(slide, coords, params, threads, judging=Judging(), probe=None)
        -> Iterator[(tiles (k, P, P, 3) uint8, reasons (k,) int8)]                  # reads + filters
    default_threads(workers) -> int                                                # threads per slide

Each candidate tile is read once with `Slide.read_region_um`; the same pixels feed the filters and the
optional zarr cache; each chunk of 16 tiles is read and filtered on a pool thread. A tile that cannot be
decoded is marked UNREADABLE (left white), never an error for the whole slide here; given a
`wsi.slides.tiff_tiles.FileTileProbe`, its window is read again stored tile by stored tile to find which of
the file's tiles are bad (the caller judges the damage from those).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from wsi.core.errors import SlideError
from wsi.slides.slide import Slide
from wsi.slides.tiff_tiles import FileTileProbe, describe_regions
from wsi.tiling.grid import UNREADABLE, classify_tiles, judge_artifacts
from wsi.tiling.params import TileParams

log = logging.getLogger(__name__)

R = TypeVar("R")

#: tiles read and filtered as one job; enough to vectorise the filters, few enough to spread over threads
_CHUNK = 16
#: ... and at most this many bytes of pixels (a chunk of 16 4,096 px tiles would be 805 MB, times the
#: 2 x threads chunks in flight)
_CHUNK_BYTES = 64 << 20


def default_threads(workers: int) -> int:
    """Reader threads per slide: the cores left to each worker process, at most 4."""
    return max(1, min(4, (os.cpu_count() or 1) // max(1, workers)))


def read_tile_chunks(
    slide: Slide, coords: np.ndarray, params: TileParams, threads: int
) -> Iterator[np.ndarray]:
    """(k, P, P, 3) uint8 chunks of the tiles at `coords`, in order, read on `threads` threads."""

    def whole(tiles: np.ndarray, bad: np.ndarray, start: int) -> np.ndarray:
        if bad.any():
            raise SlideError(f"{slide.path}: {int(bad.sum())} tile(s) could not be read")
        return tiles

    return _map_chunks(slide, coords, params, threads, whole)


@dataclass(frozen=True)
class Judging:
    """How a slide's tiles are judged besides `TileParams`, the same for every chunk.

    dark, gain, signal_level: a dark-background slide, its signal gain and (dim) level
    (`wsi.tiling.grid.classify_tiles`); blur_reduce: a coarse scan's upsampling
    (`wsi.tiling.blur.blur_reduction`); region_codes: (len(coords),) artifact code of each tile's
    thumbnail regions (`wsi.tiling.grid.TissueGrid.region_codes`; None: no artifact filter runs), judged
    with the tile's own pixels (`wsi.tiling.grid.judge_artifacts`); colours: (len(coords),) uint8 each
    tile's ink colour, its thumbnail regions' on entry, changed in place where a tile's own pixels make it
    ink (each chunk its own slice: the pool's threads never share one)."""

    dark: bool = False
    gain: float = 1.0
    signal_level: int | None = None
    blur_reduce: int = 1
    region_codes: np.ndarray | None = None
    colours: np.ndarray | None = None


def classified_chunks(
    slide: Slide,
    coords: np.ndarray,
    params: TileParams,
    threads: int,
    *,
    judging: Judging | None = None,
    probe: FileTileProbe | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(tiles (k, P, P, 3) uint8, reasons (k,) int8) per chunk of `coords`, in order, judged as `judging`
    says; probe: locates the bad stored tiles behind each unreadable tile (it collects them)."""
    how = judging or Judging()
    dark, gain, signal_level, blur_reduce = how.dark, how.gain, how.signal_level, how.blur_reduce
    region_codes, colours = how.region_codes, how.colours

    def classify(tiles: np.ndarray, bad: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        reasons = classify_tiles(
            tiles, params, dark=dark, gain=gain, signal_level=signal_level, blur_reduce=blur_reduce
        )
        if region_codes is not None:
            part = colours[start : start + len(tiles)] if colours is not None else None
            reasons = judge_artifacts(tiles, reasons, region_codes[start : start + len(tiles)], params, part)
        reasons[bad] = UNREADABLE
        return tiles, reasons

    return _map_chunks(slide, coords, params, threads, classify, probe)


def _map_chunks(
    slide: Slide,
    coords: np.ndarray,
    params: TileParams,
    threads: int,
    then: Callable[[np.ndarray, np.ndarray, int], R],
    probe: FileTileProbe | None = None,
) -> Iterator[R]:
    """`then(tiles, unreadable, start)` per chunk of `coords` (`start`: the chunk's first index), in order.

    Each chunk is read AND passed to `then` (the filters) by one pool thread, so the filters run in
    parallel with reads of other chunks (a main thread filtering while the pool reads overlapped
    poorly, measured); at most 2 x threads chunks are in flight, which bounds memory.
    """

    def work(start: int) -> R:
        return then(*_read_chunk(slide, coords[start : start + chunk], params, probe), start)

    chunk = max(1, min(_CHUNK, _CHUNK_BYTES // (params.tile_px * params.tile_px * 3)))
    starts = range(0, len(coords), chunk)
    if threads <= 1:
        yield from map(work, starts)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="tile-read") as pool:
        pending: deque[Future[R]] = deque()
        for start in starts:
            pending.append(pool.submit(work, start))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _read_chunk(
    slide: Slide, coords: np.ndarray, params: TileParams, probe: FileTileProbe | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(tiles (k, P, P, 3) uint8, unreadable (k,) bool); an unreadable tile is left white (and, given a
    probe, the stored tiles behind it are located; the caller reports them once per slide)."""
    tiles = np.empty((len(coords), params.tile_px, params.tile_px, 3), np.uint8)  # (k, P, P, 3)
    bad = np.zeros(len(coords), bool)
    for j, (x, y) in enumerate(coords):
        try:
            slide.read_region_um(int(x), int(y), params.tile_um, params.target_mpp, out=tiles[j])
        except SlideError as exc:  # one corrupt JPEG tile must not cost the whole slide
            where = str(exc)
            if probe is not None:
                plan = slide.region_plan(int(x), int(y), params.tile_um, params.target_mpp)
                where = f"at level-0 x={x} y={y}: {describe_regions(probe.locate(plan.window, str(exc)))}"
            # with a probe the caller sums the damage up in one warning per slide
            level = logging.DEBUG if probe is not None else logging.WARNING
            log.log(level, "%s: tile skipped: %s", slide.path.name, where)
            tiles[j] = 255
            bad[j] = True
    return tiles, bad

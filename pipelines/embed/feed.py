"""The embedding feed: batches of uint8 tiles, read in background workers, slide after slide.

One stream over all slides: the readers run ahead of the encoder across slide boundaries, so the next
slide's tiles are decoded while the current one is encoded (CLAM/TRIDENT's "open, read, encode, close"
idles the GPU between slides). Pixels come from the tile stage's `--save-tiles` zarr cache when it is
complete, else from `Slide.read_region_um`, as the tile stage read them; a tile that cannot be read
comes back as zeros with `ok=False`. With SlideTiles.decode="device" on a tiled JPEG TIFF, readers send
the compressed tiles in `TileBatch.raw` for `device_decode.DeviceDecoder`. Entry points: `BatchReader`
(item i = the stream's i-th batch) and `iter_batches` (batches in slide, then tile order).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, TypedDict

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from wsi.formats.tile_file import open_tile_pixels
from wsi.pipelines.embed.batches import SlideTiles, TileBatch
from wsi.pipelines.embed.device_decode.raw_tiles import RawSlideReader
from wsi.pipelines.scheduling.jobs import describe_error
from wsi.slides.slide import open_slide

log = logging.getLogger(__name__)


class _Handles:
    """The open source of the slide a reader is on (one at a time: readers move through slides)."""

    def __init__(self) -> None:
        self.key: int | None = None
        self.source: Any = None
        self.error = ""

    def get(self, index: int, st: SlideTiles) -> tuple[Any, str]:
        if self.key != index:
            self.close()
            self.key = index
            try:
                if st.pixels_path is not None:
                    self.source = open_tile_pixels(st.pixels_path)
                elif st.decode == "device" and (raw := _raw_reader(st)) is not None:
                    self.source = raw
                else:
                    self.source = open_slide(st.slide_path, backend=st.backend, mpp=st.mpp)
            except Exception as exc:
                self.error = describe_error(exc)
        return self.source, self.error

    def close(self) -> None:
        if self.source is not None and hasattr(self.source, "close"):
            self.source.close()
        self.key, self.source, self.error = None, None, ""


class _FeedState(TypedDict):
    """A BatchReader as sent to a loader worker: its plan, never its open readers."""

    slides: list[SlideTiles]
    index: list[tuple[int, int]]  # (slide, first tile) of each batch
    batch_size: int


class BatchReader(Dataset):
    """Map-style dataset whose item i is the i-th batch of the whole stream (all slides)."""

    def __init__(self, slides: Sequence[SlideTiles], batch_size: int) -> None:
        self.slides = list(slides)
        self.index = [(s, start) for s, st in enumerate(self.slides) for start in range(0, st.n, batch_size)]
        self.batch_size = batch_size
        self._local = threading.local()  # per reader thread (processes each hold their own copy)

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> _FeedState:  # spawn/forkserver workers: open handles never travel
        return {"slides": self.slides, "index": self.index, "batch_size": self.batch_size}

    def __setstate__(self, state: _FeedState) -> None:
        self.slides, self.index, self.batch_size = state["slides"], state["index"], state["batch_size"]
        self._local = threading.local()

    def _handles(self) -> _Handles:
        if not hasattr(self._local, "handles"):
            self._local.handles = _Handles()
        return self._local.handles

    def __getitem__(self, i: int) -> TileBatch:
        s, start = self.index[i]
        st = self.slides[s]
        stop = min(start + self.batch_size, st.n)
        b, p = stop - start, st.tile_px
        source, error = self._handles().get(s, st)
        if st.decode == "device" and not error and isinstance(source, RawSlideReader):
            raw = source.read(start, stop)  # compressed JPEG tiles, decoded where the encoder runs
            empty = torch.empty((b, 0, 0, 3), dtype=torch.uint8)
            return TileBatch(s, start, empty, torch.ones(b, dtype=torch.bool), "", raw)
        tiles = np.zeros((b, p, p, 3), np.uint8)
        ok = np.zeros(b, bool)
        if not error:
            if st.pixels_path is not None:
                self._read_cache(source, start, stop, tiles, ok)
            else:
                self._read_slide(source, st, start, stop, tiles, ok)
        return TileBatch(s, start, torch.from_numpy(tiles), torch.from_numpy(ok), error)

    @staticmethod
    def _read_cache(array: Any, start: int, stop: int, tiles: np.ndarray, ok: np.ndarray) -> None:
        try:
            tiles[:] = array[start:stop]
            ok[:] = True
            return
        except Exception:  # one damaged chunk: fall back to tile by tile to find it
            log.debug("batch read of the tile cache failed; reading tile by tile", exc_info=True)
        for j in range(stop - start):
            try:
                tiles[j] = array[start + j]
                ok[j] = True
            except Exception as exc:
                log.warning("tile %d of the tile cache is unreadable: %s", start + j, describe_error(exc))

    @staticmethod
    def _read_slide(
        slide: Any, st: SlideTiles, start: int, stop: int, tiles: np.ndarray, ok: np.ndarray
    ) -> None:
        for j, (x_px, y_px) in enumerate(st.coords_px[start:stop]):
            try:
                # decoded into the batch; a tile of another size than the batch's is a ValueError
                slide.read_region_um(int(x_px), int(y_px), st.tile_um, st.target_mpp, out=tiles[j])
                ok[j] = True
            except Exception as exc:
                tiles[j] = 0  # as a tile never read: a failed decode may have left part of one
                log.warning(
                    "%s: tile at level-0 (%d, %d) unreadable, skipped: %s",
                    st.slide_id, x_px, y_px, describe_error(exc),
                )  # fmt: skip


def _raw_reader(st: SlideTiles) -> RawSlideReader | None:
    """The raw JPEG tile reader for a tiled JPEG TIFF slide, else None (the CPU path reads it)."""
    try:
        return RawSlideReader.open(st)
    except Exception as exc:  # the CPU path will open it and report what is wrong
        log.info("%s: no device decode (%s); reading on the CPU", st.slide_path, describe_error(exc))
        return None


def iter_batches(
    slides: Sequence[SlideTiles],
    *,
    batch_size: int,
    readers: int,
    pin_memory: bool = False,
    mode: Literal["process", "thread"] = "process",
    prefetch: int = 2,
) -> Iterator[TileBatch]:
    """All batches of all slides, in order, read `readers` at a time ahead of the consumer.

    mode="process": a torch DataLoader with reader processes (decoding scales past the GIL).
    mode="thread": reader threads (inside daemonic dask workers, which may not start processes).
    readers=0 reads in the calling thread (tests, debugging).
    """
    dataset = BatchReader(slides, batch_size)
    if len(dataset) == 0:
        return
    if mode == "process" or readers == 0:
        loader = DataLoader(
            dataset,
            batch_size=None,  # items are already batches
            shuffle=False,
            num_workers=readers,
            pin_memory=pin_memory,
            prefetch_factor=prefetch if readers else None,
        )
        yield from loader
        return
    yield from _thread_batches(dataset, readers, pin_memory, prefetch)


def _thread_batches(
    dataset: BatchReader, readers: int, pin_memory: bool, prefetch: int
) -> Iterator[TileBatch]:
    def load(i: int) -> TileBatch:
        batch = dataset[i]
        return batch._replace(tiles=batch.tiles.pin_memory()) if pin_memory else batch

    with ThreadPoolExecutor(max_workers=readers, thread_name_prefix="wsi-embed-reader") as pool:
        pending: deque[Future[TileBatch]] = deque()
        next_i = 0
        try:
            while next_i < len(dataset) or pending:
                while next_i < len(dataset) and len(pending) < readers * prefetch:
                    pending.append(pool.submit(load, next_i))
                    next_i += 1
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()

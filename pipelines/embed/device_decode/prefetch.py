"""Decode-ahead: device decoding of the next batches overlaps the encoder's work on the current one.

Public API:
  decode_ahead(batches, decoder, depth=2, threaded=None) -> Iterator[TileBatch]
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from wsi.pipelines.embed.batches import TileBatch
from wsi.pipelines.embed.device_decode.decoder import DeviceDecoder

log = logging.getLogger(__name__)

_Decoded = tuple[TileBatch, torch.cuda.Event | None]


def decode_ahead(
    batches: Iterable[TileBatch], decoder: DeviceDecoder, depth: int = 2, threaded: bool | None = None
) -> Iterator[TileBatch]:
    """The batches with raw JPEG tiles decoded, `depth` batches ahead of the consumer.

    On CUDA (threaded=None) decoding runs in one background thread on its own CUDA stream, so the
    decoder's host-side work overlaps the encoder's forward pass of the previous batch. On the CPU it
    runs inline: two threads issuing parallel torch ops oversubscribe the cores (measured 2x slower).
    A batch whose decoding raises (e.g. out of device memory) comes back with `error` set, which fails
    that slide only. Batches that carry pixels already pass through unchanged.
    """
    device = decoder.device
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    if threaded is None:
        threaded = stream is not None

    def work(batch: TileBatch) -> _Decoded:
        if batch.raw is None:
            return batch, None
        try:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                tiles, ok = decoder.decode(batch.raw)
                event = None
                if stream is not None:
                    event = torch.cuda.Event()
                    event.record(stream)
        except Exception as exc:
            log.debug("%s: device decode failed", batch.raw.slide_path, exc_info=True)
            return batch._replace(raw=None, error=f"device decode failed: {type(exc).__name__}: {exc}"), None
        return batch._replace(tiles=tiles, ok=ok, raw=None), event

    def ready(item: _Decoded) -> TileBatch:
        batch, event = item
        if event is not None:
            current = torch.cuda.current_stream(device)
            current.wait_event(event)  # the consumer's kernels start after decoding, the host does not wait
            batch.tiles.record_stream(current)  # its memory is not reused while the consumer reads it
        return batch

    if not threaded:
        for batch in batches:
            yield ready(work(batch))
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wsi-embed-decode") as pool:
        pending: deque[Future[_Decoded]] = deque()
        for batch in batches:
            pending.append(pool.submit(work, batch))
            if len(pending) > depth:
                yield ready(pending.popleft().result())
        while pending:
            yield ready(pending.popleft().result())

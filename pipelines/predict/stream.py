"""Predicting a bag too large to load: its features stream from the HDF5 file, chunk by chunk.

A million-tile bag is 4 GB of float16 features, 8 GB once cast to float32 for the model; loading it
whole is what makes a long slide die of memory. Above `STREAM_ABOVE_TILES` tiles, a slide's bag is
read `READ_TILES` rows at a time into each model's `logits_from_chunks` (models.mil), which keeps only
the tokens at model width plus one chunk and runs the same exact two-pass scheme as an in-memory
forward, so the outputs are the in-memory ones (tests/pipelines/predict/test_predict_stream.py).

Some models read a streamed bag twice (DSMIL finds each class's critical tile before its attention,
DTFD-MIL scores its pseudo-bags before distilling them): the chunk source is re-iterable, each pass
reading the file from the top. TransMIL keeps its whole (N, 512) token sequence (square padding and
PPEG span the bag) but never the features.

What streaming gives up: per-tile contributions (heatmaps, top tiles) need the whole bag's
activations, so a streamed bag gets its prediction and a manifest note saying the heatmap was not
drawn, rather than a memory error that would lose the prediction too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import torch

from wsi.core.errors import WsiError
from wsi.formats.bags import BagStream, finite_chunks, fits_in_memory, open_bag_stream, read_bag_header
from wsi.pipelines.inputs import Item
from wsi.pipelines.predict.run_model import RunModel
from wsi.pipelines.scheduling.devices import autocast_for

#: slide bags with more tiles than this are predicted streamed (heatmaps off for them); at 131,072
#: tiles the in-memory path holds ~1.6 GB of features (float16 + the float32 copy) besides the model's
#: feature rows read from the file at a time (16 MB of 2048-d float16; larger reads gain nothing)
READ_TILES = 4096


def stream_length(run: RunModel, case: Item, above: int | None) -> int | None:
    """The tile count of `case`'s bag when it is predicted streamed, else None: one slide's bag of
    more than `above` tiles (None: never) or too large for the memory available now, and models that
    read a bag in chunks."""
    if above is None or run.adapter.name != "bags" or case.slides:
        return None
    if not all(hasattr(m, "logits_from_chunks") for m in run.models):
        return None  # e.g. ABMIL: its whole bag is (N, 128) after the first layer, small anyway
    try:
        header = read_bag_header(case.path)
    except WsiError:  # unreadable: the case fails on its own where it is loaded, the batch goes on
        return None
    n = header.n_tiles
    # a bag whose features (and their float32 copy) would not fit the memory there is now streams too
    whole = n * header.dim * (np.dtype(header.dtype).itemsize + 4)
    return n if n > above or (n and not fits_in_memory(whole)) else None


def streamed_outputs(run: RunModel, case: Item, *, read_tiles: int | None = None) -> tuple[np.ndarray, int]:
    """(outputs (K,), tiles) of one bag read from disk chunk by chunk (`read_tiles` rows at a time,
    default READ_TILES): the mean over the run's models of each kind's outputs, as
    `RunModel.outputs` computes them for a loaded bag."""
    read_tiles = READ_TILES if read_tiles is None else read_tiles
    adapter: Any = run.adapter
    mpp = adapter.mpp_by_slide.get(case.id, adapter.mpp)
    stream = open_bag_stream(case.path, mpp=mpp, require_um=adapter.uses_positions)
    outputs = []
    for model, kind in zip(run.models, run.kinds, strict=True):
        with torch.inference_mode(), autocast_for(run.device)():
            logits = cast(Any, model).logits_from_chunks(
                ChunkSource(stream, read_tiles, run.device), n_tiles=stream.n_tiles
            )
            outputs.append(kind.outputs(logits.float()).float())
    return torch.stack(outputs).mean(0)[0].cpu().numpy(), stream.n_tiles


class ChunkSource:
    """(feats (n, D) as stored, coords_um (n, 2) or None) of one streamed bag, `size` rows at a time;
    re-iterable: every `iter()` reads the bag from the top. A chunk is valid until the next is asked
    for (the reader reuses its buffer)."""

    def __init__(self, stream: BagStream, size: int, device: torch.device) -> None:
        self.stream, self.size, self.device = stream, size, device

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        coords = self.stream.bag.coords_um  # None: a pixel-layout bag of unknown resolution
        start = 0
        for feats in finite_chunks(self.stream, self.size):
            x = torch.from_numpy(feats).to(self.device)  # as stored: the model casts a chunk at a time
            rows = slice(start, start + len(feats))
            c = None if coords is None else torch.from_numpy(coords[rows]).to(self.device)
            start += len(feats)
            yield x, c


__all__ = ["READ_TILES", "ChunkSource", "stream_length", "streamed_outputs"]

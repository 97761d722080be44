"""The embed stage (`wsi embed`): tiles -> encoder -> per-slide HDF5 feature bags.

Modules, in the order a tile meets them:
  options.py         EmbedOptions, the stage's typed config
  stage.py           tile files (or slides, tiled first) -> slide jobs -> bags + manifest; skip/redo
  checks.py          ids that clash by case or belong to another slide's bag; bad tiles per slide
  batches.py         the types that flow: SlideTiles, TileBatch, RawBatch
  feed.py            reader workers: batches of tiles (pixels, or raw JPEG tiles for device decode)
  device_decode/     raw JPEG tiles -> tiles on the device (nvjpeg / libjpeg-turbo + torch resizing)
  engine.py          the device side: encoder runtime, encoding, provenance, bag writing thread
  worker.py          the dask side: one encoder per worker

Public API:
  embed_tiles(*, tiles_dir, out_dir, options=EmbedOptions(), slide_ids=None, workers=1, scheduler=None)
  embed_slides(sources, *, out_dir, options=EmbedOptions(), tile_params=None, ...)   tile, then embed
  EmbedOptions        encoder, weights, random_init, device, precision, compile, threads, batch_size,
                      readers, reader_mode, decode ("cpu" | "device" | "auto"), dtype, max_bad_tiles,
                      use_cache, overwrite
  bag_dir(out_dir, encoder_id) -> Path
  bad_tile_report(results, *, out_dir, encoder) -> list[str]   slides whose bags left out unreadable tiles
"""

from pipelines.embed.options import EmbedOptions
from pipelines.embed.stage import bad_tile_report, bag_dir, embed_slides, embed_tiles

__all__ = ["EmbedOptions", "bad_tile_report", "bag_dir", "embed_slides", "embed_tiles"]

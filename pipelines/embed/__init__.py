"""The embed stage (`wsi embed`): tiles -> encoder -> per-slide HDF5 feature bags.

Public API (modules: feed.py reading, engine.py device + bag writing, stage.py batches, worker.py dask):
  embed_tiles(*, tiles_dir, out_dir, options=EmbedOptions(), slide_ids=None, workers=1, scheduler=None)
  embed_slides(sources, *, out_dir, options=EmbedOptions(), tile_params=None, ...)   tile, then embed
  EmbedOptions        encoder, weights, random_init, device, precision, compile, threads, batch_size,
                      readers, reader_mode, decode ("cpu" | "device" | "auto"), dtype, max_bad_tiles,
                      use_cache, overwrite
  bag_dir(out_dir, encoder_id) -> Path
"""

from pipelines.embed.engine import EmbedOptions
from pipelines.embed.stage import bag_dir, embed_slides, embed_tiles

__all__ = ["EmbedOptions", "bag_dir", "embed_slides", "embed_tiles"]

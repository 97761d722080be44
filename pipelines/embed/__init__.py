"""The embed stage (`wsi embed`): tiles -> one or several encoders -> per-slide HDF5 feature bags.

`embed_tiles(tiles_dir, *, out_dir, options)` and `tile_and_embed(sources, *, out_dir, options)` return
an `EmbedResult` (one BagResult per slide and encoder). Modules, in the order a tile meets them:
  config.py (EmbedOptions, EncoderChoice), stage.py (tile files or slides -> slide works -> bags and
  manifests), plan.py (per slide and encoder: empty, refused, current or a bag to make), checks.py,
  batches.py (SlideTiles, TileBatch, RawBatch), feed.py (reader workers), device_decode/ (JPEG tiles
  decoded on the device), stain.py (--stain-norm reference), runtime.py (encoders on their device),
  engine.py (stain normalisation, every encoder on one decode, the bag writer thread), gpus.py (one
  worker per GPU), worker.py (the run's encoders once per dask worker).
"""

from wsi.pipelines.embed.config import EmbedOptions, EncoderChoice
from wsi.pipelines.embed.stage import (
    BagResult,
    EmbedResult,
    bad_tile_report,
    bag_dir,
    embed_tiles,
    results_by_encoder,
    tile_and_embed,
)

__all__ = [
    "BagResult",
    "EmbedOptions",
    "EmbedResult",
    "EncoderChoice",
    "bad_tile_report",
    "bag_dir",
    "embed_tiles",
    "results_by_encoder",
    "tile_and_embed",
]

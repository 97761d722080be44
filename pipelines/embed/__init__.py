"""The embed stage (`wsi embed`): tiles -> one or several encoders -> per-slide HDF5 feature bags.

Modules, in the order a tile meets them:
  config.py          EmbedOptions (+ EncoderChoice per encoder of a multi-encoder run), the stage's config
  stage.py           tile files (or slides, tiled first) -> slide works -> bags + manifests
  plan.py            per slide and encoder: empty, refused, current (skipped) or a bag to make
  checks.py          ids that clash by case or belong to another slide's bag; bad tiles per slide
  batches.py         the types that flow: SlideTiles, TileBatch, RawBatch
  feed.py            reader workers: batches of tiles (pixels, or raw JPEG tiles for device decode)
  device_decode/     raw JPEG tiles -> tiles on the device (nvjpeg / libjpeg-turbo + torch resizing)
  stain.py           the --stain-norm reference (default, saved, or fitted from tiles) and its provenance
  runtime.py         the encoders on their device (Encoder.inference_fn, autocast, --batch-size auto)
  engine.py          the device side: stain normalisation, every encoder on one decode, bag writing thread
  gpus.py            --gpus: one worker per GPU, and which GPU a dask worker takes
  worker.py          the dask side: the run's encoders once per worker

Public API:
  embed_tiles(tiles_dir, *, out_dir, options=None, slide_ids=None, **settings) -> EmbedResult
              one BagResult per slide and encoder
  tile_and_embed(sources, *, out_dir, options=None, tile_params=None, tile_options=None, **settings)
              tile, then embed; slides the tiling failed or left empty are failed / empty rows
  EmbedOptions        encoder, weights, random_init, expected_sha256, input_px, encoders (several), device,
                      precision, compile, threads, batch_size (int | "auto"), readers, reader_mode, decode
                      ("cpu" | "device" | "auto"), dtype, max_bad_tiles, use_cache, overwrite,
                      stain_norm ("macenko" | "reinhard" | None), stain_reference; how the batch runs:
                      workers, scheduler, gpus (N | "all"), progress
  EncoderChoice(name, weights=None, expected_sha256=None, input_px=None)
  BagResult           JobResult + encoder_id;  results_by_encoder(results) -> {encoder_id: [rows]}
  bag_dir(out_dir, encoder_id) -> Path
  bad_tile_report(results, *, out_dir, encoder) -> list[str]   slides whose bags left out unreadable tiles
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

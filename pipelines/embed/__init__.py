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
  embed_tiles(*, tiles_dir, out_dir, options=EmbedOptions(), slide_ids=None, workers=1, scheduler=None,
              progress=True, gpus=None) -> list[JobResult]     one BagResult per slide and encoder
  embed_slides(sources, *, out_dir, options=EmbedOptions(), tile_params=None, ..., gpus=None)   tile, then
              embed; slides the tiling failed or left empty are failed / empty rows
  EmbedOptions        encoder, weights, random_init, expected_sha256, input_px, encoders (several), device,
                      precision, compile, threads, batch_size (int | "auto"), readers, reader_mode, decode
                      ("cpu" | "device" | "auto"), dtype, max_bad_tiles, use_cache, overwrite,
                      stain_norm ("macenko" | "reinhard" | None), stain_reference
  EncoderChoice(name, weights=None, expected_sha256=None, input_px=None)
  BagResult           JobResult + encoder_id;  results_by_encoder(results) -> {encoder_id: [rows]}
  bag_dir(out_dir, encoder_id) -> Path
  bad_tile_report(results, *, out_dir, encoder) -> list[str]   slides whose bags left out unreadable tiles
"""

from wsi.pipelines.embed.config import EmbedOptions, EncoderChoice
from wsi.pipelines.embed.stage import (
    BagResult,
    bad_tile_report,
    bag_dir,
    embed_slides,
    embed_tiles,
    results_by_encoder,
)

__all__ = [
    "BagResult",
    "EmbedOptions",
    "EncoderChoice",
    "bad_tile_report",
    "bag_dir",
    "embed_slides",
    "embed_tiles",
    "results_by_encoder",
]

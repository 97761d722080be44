"""Device decode: raw JPEG tile bytes from the TIFF, decoded, assembled and resized on the device.

Why: on a GPU host the CPU path (openslide decodes JPEG tiles, PIL resizes, ~16 ms per tile per process)
caps embedding far below what the encoder does. Here reader workers only slice the compressed JPEG
tiles out of the file (a few kB each); the main process decodes a whole batch of them in one call
(`torchvision.io.decode_jpeg(list, device=...)`: nvjpeg on CUDA, libjpeg-turbo on the CPU - the same
code, so it is tested here), assembles each tile's level region with one gather and resizes it with the
same filters PIL uses in `Slide.read_region_um` (as batched weight matrices), without leaving the device.

Level, window and filter come from `wsi.slides.region.plan_region`, the plan `Slide.read_region_um` follows,
so tiles equal the CPU path within JPEG/resampling rounding. Parts outside the level are white. A slide
that is not a tiled 8-bit JPEG TIFF is read by the CPU path (the reader returns pixels).

One idea per module, in the order a batch meets them:
  jpeg.py        complete_jpeg(tile, tables, rgb) -> bytes      abbreviated TIFF JPEG -> full stream
  raw_tiles.py   RawSlideReader.open(st) -> reader | None; reader.read(start, stop) -> RawBatch
                 (runs in reader workers; None: not a tiled JPEG TIFF, use the CPU path)
  tile_bytes.py  the JPEG cells of a batch, each once, in coalesced reads, completed in place (as arrays:
                 no object per tile; benchmarks/embed_feed.py measures it against a plain pread loop)
  iovec.py       preadv(fd, iov, offset): one read into many pieces of memory, the iovec array from numpy
  codecs.py      JPEG batch decoders behind one signature: torchvision (default), nvImageCodec
  decoder.py     DeviceDecoder(device, codec).decode(raw) -> (tiles (b,P,P,3) uint8 on device, ok (b,) bool)
  resample.py    the PIL arithmetic (block means, resampling weights) as batched torch operations
  prefetch.py    decode_ahead(batches, decoder, depth=2) -> Iterator[TileBatch]   (CUDA: in a thread,
                 on a side stream, depth batches ahead)
The batch types (SlideTiles, TileBatch, RawBatch) live in pipelines/embed/batches.py.
"""

from wsi.pipelines.embed.device_decode.decoder import DeviceDecoder
from wsi.pipelines.embed.device_decode.jpeg import complete_jpeg
from wsi.pipelines.embed.device_decode.prefetch import decode_ahead
from wsi.pipelines.embed.device_decode.raw_tiles import RawSlideReader

__all__ = ["DeviceDecoder", "RawSlideReader", "complete_jpeg", "decode_ahead"]

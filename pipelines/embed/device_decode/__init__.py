"""Device decode: raw JPEG tile bytes from the TIFF, decoded, assembled and resized on the device.

Why: on a GPU host the CPU path (openslide decodes, PIL resizes, ~16 ms per tile per process) caps
embedding far below the encoder. Reader workers only slice the compressed tiles out of the file; the
main process decodes a batch in one call (torchvision's decode_jpeg: nvjpeg on CUDA, libjpeg-turbo on
the CPU, so it is tested here), assembles each tile's region with one gather and resizes it with PIL's
filters as batched weight matrices. Level, window and filter come from `wsi.slides.region.plan_region`,
as for `Slide.read_region_um`, so tiles equal the CPU path within JPEG/resampling rounding; a slide that
is not a tiled 8-bit JPEG TIFF is read by the CPU path. Modules in the order a batch meets them: jpeg.py,
raw_tiles.py, tile_bytes.py, iovec.py, codecs.py, decoder.py, resample.py, prefetch.py.
"""

from wsi.pipelines.embed.device_decode.decoder import DeviceDecoder
from wsi.pipelines.embed.device_decode.jpeg import complete_jpeg
from wsi.pipelines.embed.device_decode.prefetch import decode_ahead
from wsi.pipelines.embed.device_decode.raw_tiles import RawSlideReader

__all__ = ["DeviceDecoder", "RawSlideReader", "complete_jpeg", "decode_ahead"]

"""Generated sample slides: pyramidal, tiled, JPEG-compressed Aperio-style TIFFs with known content.

Tests, the demo and the benchmarks need slides whose tissue, blank background and blurred regions lie
at KNOWN places, at any size and resolution, that openslide and tiffslide both open with the right MPP.

  scene.py    where things are: tissue / blur boxes in micrometres, `SampleSlide`, `default_scene`
  texture.py  what tissue looks like: periodic H&E-like (procedural or real) or fluorescence-like atlases
              and the painter
  writer.py   the TIFF: `write_sample_slide`, `write_sample_cohort`, `write_truncated_copy`
"""

from wsi.synthetic.scene import Box, SampleSlide, Stain, Style, Texture, default_scene
from wsi.synthetic.texture import find_real_he_source
from wsi.synthetic.writer import write_sample_cohort, write_sample_slide, write_truncated_copy

__all__ = [
    "Box",
    "SampleSlide",
    "Stain",
    "Style",
    "Texture",
    "default_scene",
    "find_real_he_source",
    "write_sample_cohort",
    "write_sample_slide",
    "write_truncated_copy",
]

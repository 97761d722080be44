"""What a generated slide shows and where: tissue and blur boxes in micrometres, and the SampleSlide record.

A scene depends only on its size in micrometres and a seed, never on the resolution it is written at,
so the same tissue lies at the same micrometres at 0.25 and at 0.5 um/px.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from wsi.core.config import MAX_SEED, config_model, setting
from wsi.core.errors import ConfigError

Box = tuple[float, float, float, float]  # (x0_um, y0_um, x1_um, y1_um), half-open
Style = Literal["a", "b"]  # two tissue classes (see wsi.synthetic.texture)
Texture = Literal["procedural", "real", "auto"]
Stain = Literal["he", "fluorescence"]  # brightfield H&E, or a dark-background fluorescence scan
#: a cohort: at most this many slides; a side at most 10 cm, beyond any glass slide (75 x 25 mm)
MAX_SLIDES, MAX_SIDE_UM = 10_000, 100_000.0


@config_model
@dataclass(frozen=True)
class CohortSettings:
    """What `wsi make-slides` writes: `write_sample_cohort`'s settings, whose defaults are these."""

    n: int = setting(4, ge=1, le=MAX_SLIDES, help="Number of slides.")
    size_um: float = setting(
        1500.0, ge=1.0, le=MAX_SIDE_UM, help="Side of each (square) slide in micrometres."
    )
    mpp: float = setting(0.5, ge=0.01, le=50.0, help="Level-0 resolution in um/px written into the slides.")
    styles: tuple[Style, ...] = setting(
        ("a",),
        help="Tissue class(es): a = dense small dark nuclei, pink; b = sparse large pale nuclei, lilac. "
        "Repeat to alternate.",
    )
    texture: Texture = setting(
        "procedural",
        help="Tissue pixels: procedural, real H&E from ../shared/data/slides, or real when present.",
    )
    seed: int = setting(0, ge=0, le=MAX_SEED - MAX_SLIDES, help="Seed of slide 0 (+1 per slide).")
    prefix: str = setting("sample", help="File names are PREFIX-NNN.svs.")
    tile_px: int = setting(256, ge=16, le=4096, help="TIFF tile size in pixels (a multiple of 16).")
    write_mpp: bool = setting(True, help="Write resolution metadata (--no-mpp: none, to test --mpp).")

    def __post_init__(self) -> None:
        if self.tile_px % 16:
            raise ConfigError(f"--tile-px {self.tile_px} must be a multiple of 16 (a TIFF rule)")
        if not self.styles:
            raise ConfigError("give at least one --style (a or b)")


def as_box(values: Iterable[float]) -> Box:
    """Four numbers as a Box of floats; ValueError when there are not four."""
    x0, y0, x1, y1 = (float(v) for v in values)
    return (x0, y0, x1, y1)


@dataclass(frozen=True)
class SampleSlide:
    """What was written and where things are. Boxes are (x0_um, y0_um, x1_um, y1_um) in level 0."""

    path: Path
    mpp: float  # level-0 um/px (also when it was not written into the file)
    width_px: int
    height_px: int
    tissue_boxes_um: tuple[Box, ...]
    blur_boxes_um: tuple[Box, ...]  # blurred tissue; each lies inside a tissue box
    style: str = "a"
    texture: str = "procedural"
    seed: int = 0
    tile_px: int = 256
    n_levels: int = 1
    mpp_written: bool = True
    corrupt_tiles: tuple[tuple[int, int], ...] = field(default=())  # level-0 (col, row) tile indices
    stain: str = "he"  # "he" or "fluorescence" (dark background)

    @property
    def width_um(self) -> float:
        return self.width_px * self.mpp

    @property
    def height_um(self) -> float:
        return self.height_px * self.mpp

    def tissue_fraction(self, x0_um: float, y0_um: float, size_um: float) -> float:
        """Fraction of the square [x0, x0+size)^2 (um) covered by tissue boxes (blurred or not)."""
        return _box_fraction(self.tissue_boxes_um, x0_um, y0_um, size_um)

    def blur_fraction(self, x0_um: float, y0_um: float, size_um: float) -> float:
        """Fraction of the square covered by blurred tissue."""
        return _box_fraction(self.blur_boxes_um, x0_um, y0_um, size_um)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready description (file name only, not the full path): one entry of `slides.json`."""
        d = dataclasses.asdict(self)
        d["path"] = self.path.name
        return d

    def corrupt_tile_boxes_px(self) -> list[tuple[int, int, int, int]]:
        """Level-0 pixel boxes (x0, y0, x1, y1) of the damaged tiles."""
        t = self.tile_px
        return [(c * t, r * t, (c + 1) * t, (r + 1) * t) for c, r in self.corrupt_tiles]


def _box_fraction(boxes: Sequence[Box], x0: float, y0: float, size: float) -> float:
    """Boxes are assumed not to overlap each other (the default scenes never do)."""
    area = 0.0
    for bx0, by0, bx1, by1 in boxes:
        w = min(x0 + size, bx1) - max(x0, bx0)
        h = min(y0 + size, by1) - max(y0, by0)
        if w > 0 and h > 0:
            area += w * h
    return min(1.0, area / (size * size))


def default_scene(width_um: float, height_um: float, *, seed: int = 0) -> tuple[list[Box], list[Box]]:
    """Two tissue boxes with a margin of blank glass, and one blurred box in the lower part of the first.

    Depends only on the size in micrometres and the seed, so the same scene can be written at any MPP.
    Tissue covers about 45% of the slide; the blurred box about 40% of the first tissue box.
    """
    rng = np.random.default_rng(seed)
    j = rng.uniform(-0.02, 0.02, size=6)
    w, h = width_um, height_um
    left = (w * (0.08 + j[0]), h * (0.10 + j[1]), w * (0.46 + j[2]), h * 0.90)
    right = (w * 0.56, h * (0.14 + j[3]), w * (0.92 + j[4]), h * (0.76 + j[5]))
    bh = left[3] - left[1]
    bw = left[2] - left[0]
    blur = (left[0] + 0.08 * bw, left[1] + 0.52 * bh, left[2] - 0.08 * bw, left[3] - 0.04 * bh)

    def tidy(box: Iterable[float]) -> Box:
        return as_box(round(v, 1) for v in box)  # numpy's or Python's round, as the value is

    return [tidy(left), tidy(right)], [tidy(blur)]

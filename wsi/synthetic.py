"""Generated sample slides: pyramidal, tiled, JPEG-compressed Aperio-style TIFFs with known content.

Tests, the demo and the benchmarks need slides whose tissue, blank background and blurred regions lie
at KNOWN places, at any size and resolution, that openslide and tiffslide both open with the right MPP.
Content is a seeded function of position in micrometres (a periodic texture atlas sampled per tile), so
the same scene written at 0.25 and at 0.5 um/px shows the same tissue in the same micrometres, and a
slide of any size is written tile by tile without holding it in memory.

File layout (what Aperio scanners write, so both readers take the Aperio path): IFD 0 the tiled level 0
with an `Aperio Image Library` ImageDescription carrying `MPP = ...`; IFD 1 a small stripped thumbnail;
IFD 2.. the tiled, halved pyramid levels. Resolution tags (pixels per centimetre) are written as well.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import tifffile
from PIL import Image
from scipy import fft as sfft
from scipy import ndimage

from wsi.files import atomic_path

log = logging.getLogger(__name__)

Box = tuple[float, float, float, float]  # (x0_um, y0_um, x1_um, y1_um), half-open
Style = Literal["a", "b"]
Texture = Literal["procedural", "real", "auto"]

#: resolution at which the procedural texture atlas is built before resampling to each level
_REF_MPP = 0.25
#: period of the procedural texture (micrometres); large enough that repeats are not obvious in a tile
_PERIOD_UM = 512.0
#: near-white slide background (glass), as scanners record it
_BACKGROUND_RGB = (243, 243, 245)
#: blur applied to the blurred regions (Gaussian sigma, micrometres): out of focus at any tile size
_BLUR_SIGMA_UM = 4.0
_REAL_SOURCE_NAME = "CMU-1-Small-Region.svs"
#: real H&E atlases stay at about the source's resolution (CMU-1 is 0.499 um/px) to keep them small
_REAL_MPP = 0.5


@dataclass(frozen=True)
class _StyleParams:
    """Two visibly different tissue classes: nuclei density/size and stain hue differ."""

    cell_um: float  # one candidate nucleus per cell of this size
    p_nucleus: float  # probability that a cell holds a nucleus
    radius_um: tuple[float, float]  # nucleus radius range
    nucleus_rgb: tuple[int, int, int]
    stroma_rgb: tuple[int, int, int]
    fibre_rgb: tuple[int, int, int]


_STYLES: dict[str, _StyleParams] = {
    # a: dense, small, dark nuclei on pink stroma
    "a": _StyleParams(12.8, 0.75, (2.2, 3.6), (72, 38, 118), (236, 158, 196), (214, 112, 164)),
    # b: sparse, large, pale blue-violet nuclei on lilac stroma
    "b": _StyleParams(25.6, 0.6, (4.5, 7.0), (118, 92, 178), (208, 160, 222), (176, 128, 204)),
}


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

    def as_dict(self) -> dict[str, object]:
        """JSON-ready description (file name only, not the full path)."""
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

    def tidy(box: tuple[float, ...]) -> Box:
        return tuple(round(v, 1) for v in box)  # type: ignore[return-value]

    return [tidy(left), tidy(right)], [tidy(blur)]


# --------------------------------------------------------------------------------------------- texture
def _periodic_blur(img: np.ndarray, sigma_px: float | tuple[float, float]) -> np.ndarray:
    """Gaussian blur of a periodic (H, W[, C]) image through the FFT: exact wrap-around, any sigma."""
    x = np.asarray(img, np.float32)
    spec = sfft.rfft2(x, axes=(0, 1))  # scipy keeps float32 (numpy would promote to float64)
    sigma = (*np.broadcast_to(sigma_px, 2), *([0] * (x.ndim - 2)))  # no blur across channels
    spec = ndimage.fourier_gaussian(spec, sigma=sigma, n=x.shape[1])
    return sfft.irfft2(spec, s=x.shape[:2], axes=(0, 1)).astype(np.float32, copy=False)


def _procedural_atlas(style: str) -> np.ndarray:
    """A periodic H&E-like texture, (N, N, 3) uint8 at _REF_MPP, N = _PERIOD_UM / _REF_MPP.

    Fixed per style: slides differ by where each tissue box starts in it, so it is built once per process.
    """
    p = _STYLES[style]
    n = round(_PERIOD_UM / _REF_MPP)
    rng = np.random.default_rng(ord(style))

    def noise() -> np.ndarray:
        return rng.standard_normal((n, n), dtype=np.float32)

    # stroma: pink base with anisotropic fibres (Gaussian-filtered noise, wrapped so the atlas tiles)
    fibres = _periodic_blur(noise(), (1.2, 10.0))
    fibres = np.clip(fibres * (0.5 / (fibres.std() + 1e-9)) + 0.5, 0, 1)
    cloud = _periodic_blur(noise(), 40.0)
    cloud *= 6.0 / (cloud.std() + 1e-9)
    chromatin = _periodic_blur(noise(), 1.0) * 25.0
    grain = noise() * 3.0
    # nuclei: jittered points on a grid of cells, drawn as soft ellipses (wrapped)
    mask = np.zeros((n, n), np.float32)
    cells = round(_PERIOD_UM / p.cell_um)
    cell_px = n / cells
    r_max = math.ceil(p.radius_um[1] / _REF_MPP) + 2
    yy, xx = np.mgrid[-r_max : r_max + 1, -r_max : r_max + 1].astype(np.float32)
    for cy in range(cells):
        for cx in range(cells):
            if rng.random() > p.p_nucleus:
                continue
            r_px = rng.uniform(*p.radius_um) / _REF_MPP
            ecc = rng.uniform(0.65, 1.0)
            ang = rng.uniform(0, np.pi)
            px, py = (cx + rng.random()) * cell_px, (cy + rng.random()) * cell_px
            half = math.ceil(r_px) + 2
            window = np.s_[r_max - half : r_max + half + 1, r_max - half : r_max + half + 1]
            fy, fx = yy[window] - (py % 1), xx[window] - (px % 1)
            u = (fx * np.cos(ang) + fy * np.sin(ang)) / r_px
            v = (-fx * np.sin(ang) + fy * np.cos(ang)) / (r_px * ecc)
            disc = np.clip((1.0 - np.sqrt(u * u + v * v)) * r_px, 0, 1)
            rows = (np.arange(-half, half + 1) + int(py)) % n
            cols = (np.arange(-half, half + 1) + int(px)) % n
            mask[np.ix_(rows, cols)] = np.maximum(mask[np.ix_(rows, cols)], disc * rng.uniform(0.75, 1.0))
    out = np.empty((n, n, 3), np.uint8)
    for c in range(3):  # per channel: keeps the temporaries 2-D float32
        chan = p.stroma_rgb[c] + (p.fibre_rgb[c] - p.stroma_rgb[c]) * fibres + cloud
        chan += (p.nucleus_rgb[c] + chromatin - chan) * mask
        chan += grain
        out[..., c] = np.clip(chan, 0, 255)
    return out


@functools.lru_cache(maxsize=4)
def _texture(kind: str, style: str, source: str | None) -> tuple[np.ndarray, np.ndarray, float]:
    """(sharp, out-of-focus, um/px) periodic atlases; built once per process and kind."""
    if kind == "real" and source:
        atlas, atlas_mpp = _real_atlas(Path(source), style), _REAL_MPP
    else:
        atlas, atlas_mpp = _procedural_atlas(style), _REF_MPP
    blurred = np.clip(_periodic_blur(atlas, _BLUR_SIGMA_UM / atlas_mpp) + 0.5, 0, 255).astype(np.uint8)
    atlas.flags.writeable = False
    blurred.flags.writeable = False
    return atlas, blurred, atlas_mpp


def find_real_he_source() -> Path | None:
    """The real H&E slide used to paint tissue, from ../shared/data/slides next to the checkout."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        candidate = root.parent / "shared" / "data" / "slides" / _REAL_SOURCE_NAME
        if candidate.is_file():
            return candidate
    return None


def _real_atlas(source: Path, style: str, crop_um: float = 400.0) -> np.ndarray:
    """Real H&E pixels: the crop of `source` with the most tissue, mirrored to tile seamlessly.

    At _REAL_MPP. Style b zooms the texture (larger nuclei) and shifts the stain towards blue-violet, so
    the two classes differ in texture also when painted with real pixels.
    """
    from wsi.slide import open_slide

    zoom = 1.5 if style == "b" else 1.0
    side_um = crop_um / zoom
    step_um = 8.0
    with open_slide(source) as slide:
        thumb = slide.thumbnail_at(step_um)
        sat = np.asarray(Image.fromarray(thumb).convert("HSV"))[..., 1].astype(np.float32)
        win = max(1, round(side_um / step_um))
        iy = ix = 0
        if sat.shape[0] > win and sat.shape[1] > win:
            # mean saturation of every win x win window, indexed by its top-left corner
            score = ndimage.uniform_filter(sat, size=win, mode="constant", origin=-(win // 2))
            score = score[: sat.shape[0] - win + 1, : sat.shape[1] - win + 1]
            iy, ix = np.unravel_index(int(np.argmax(score)), score.shape)
        x0_px, y0_px = round(ix * step_um / slide.mpp), round(iy * step_um / slide.mpp)
        crop = slide.read_region_um(x0_px, y0_px, side_um, _REAL_MPP / zoom)
    if style == "b":
        shift = np.asarray([-18, -6, 22], np.int16)
        crop = np.clip(crop.astype(np.int16) + shift, 0, 255).astype(np.uint8)
    top = np.concatenate([crop, crop[:, ::-1]], axis=1)
    return np.concatenate([top, top[::-1]], axis=0)


def _resample_periodic(atlas: np.ndarray, factor: float) -> np.ndarray:
    """Resize a periodic texture by `factor` with antialiasing, using wrapped neighbours at the seams."""
    if abs(factor - 1.0) < 1e-9:
        return atlas
    h, w = atlas.shape[:2]
    pad = 32
    padded = np.pad(atlas, ((pad, pad), (pad, pad), (0, 0)), mode="wrap")
    out_w, out_h = max(1, round(w * factor)), max(1, round(h * factor))
    img = Image.fromarray(padded).resize(
        (out_w, out_h), resample=Image.Resampling.LANCZOS, box=(pad, pad, pad + w, pad + h)
    )
    return np.asarray(img)


@dataclass
class _Painter:
    """Renders any pixel rectangle of the scene at a given um/px from per-level texture atlases."""

    tissue_boxes_um: Sequence[Box]
    blur_boxes_um: Sequence[Box]
    offsets_um: Sequence[tuple[float, float]]  # per tissue box: where in the texture it starts
    atlas_ref: np.ndarray  # at atlas_mpp
    blurred_ref: np.ndarray
    atlas_mpp: float
    _cache: dict[float, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def _atlases(self, mpp: float) -> tuple[np.ndarray, np.ndarray]:
        key = round(mpp, 9)
        if key not in self._cache:
            f = self.atlas_mpp / mpp
            self._cache[key] = (
                _resample_periodic(self.atlas_ref, f),
                _resample_periodic(self.blurred_ref, f),
            )
        return self._cache[key]

    def render(self, x_px: int, y_px: int, w_px: int, h_px: int, mpp: float) -> np.ndarray:
        """(h, w, 3) uint8 of the scene's pixels [x, x+w) x [y, y+h) at `mpp` um/px."""
        sharp, blurred = self._atlases(mpp)
        tile = np.empty((h_px, w_px, 3), np.uint8)
        tile[:] = _BACKGROUND_RGB
        for box, (ox_um, oy_um) in zip(self.tissue_boxes_um, self.offsets_um, strict=True):
            self._paint(tile, sharp, box, ox_um, oy_um, x_px, y_px, mpp)
            for blur in self.blur_boxes_um:
                inter = (*np.maximum(box[:2], blur[:2]), *np.minimum(box[2:], blur[2:]))
                if inter[0] < inter[2] and inter[1] < inter[3]:
                    self._paint(tile, blurred, inter, ox_um, oy_um, x_px, y_px, mpp)
        return tile

    @staticmethod
    def _paint(
        tile: np.ndarray, atlas: np.ndarray, box: Sequence[float], ox_um: float, oy_um: float,
        x_px: int, y_px: int, mpp: float,
    ) -> None:
        """Copy the atlas into the part of `tile` (whose top-left is pixel x_px, y_px) inside `box`."""
        h_px, w_px = tile.shape[:2]
        # pixel i covers [i*mpp, (i+1)*mpp): it is in the box when its centre is
        c0 = max(0, math.ceil(box[0] / mpp - 0.5) - x_px)
        c1 = min(w_px, math.ceil(box[2] / mpp - 0.5) - x_px)
        r0 = max(0, math.ceil(box[1] / mpp - 0.5) - y_px)
        r1 = min(h_px, math.ceil(box[3] / mpp - 0.5) - y_px)
        if c0 >= c1 or r0 >= r1:
            return
        ah, aw = atlas.shape[:2]
        cols = (np.arange(x_px + c0, x_px + c1) + round(ox_um / mpp)) % aw
        rows = (np.arange(y_px + r0, y_px + r1) + round(oy_um / mpp)) % ah
        tile[r0:r1, c0:c1] = atlas[np.ix_(rows, cols)]


# --------------------------------------------------------------------------------------------- writer
def _aperio_description(w: int, h: int, tile_px: int, quality: int, mpp: float | None) -> str:
    text = (
        f"Aperio Image Library v12.0.0 (wsi sample)\r\n"
        f"{w}x{h} [0,0 {w}x{h}] ({tile_px}x{tile_px}) JPEG/RGB Q={quality}"
    )
    fields = [text, f"AppMag = {round(10 / mpp) if mpp else 20}", "Filename = wsi-sample"]
    if mpp is not None:
        fields.append(f"MPP = {mpp:.6g}")
    return "|".join(fields)


def _tiles(painter: _Painter, w: int, h: int, tile_px: int, mpp: float) -> Iterator[np.ndarray]:
    for y in range(0, h, tile_px):
        for x in range(0, w, tile_px):
            yield painter.render(x, y, tile_px, tile_px, mpp)


def write_sample_slide(
    path: str | os.PathLike[str],
    *,
    size_um: float | tuple[float, float] = 1500.0,
    mpp: float = 0.5,
    style: Style = "a",
    texture: Texture = "procedural",
    seed: int = 0,
    tissue_boxes_um: Sequence[Box] | None = None,
    blur_boxes_um: Sequence[Box] | None = None,
    tile_px: int = 256,
    jpeg_quality: int = 85,
    n_levels: int | None = None,
    write_mpp: bool = True,
    corrupt_tiles: Sequence[tuple[int, int]] = (),
    real_source: str | os.PathLike[str] | None = None,
    bigtiff: bool | None = None,
) -> SampleSlide:
    """Write one sample slide, tile by tile, and say where its tissue and blur are.

    size_um: (width, height) or one side, micrometres; pixels = round(size / mpp).
    style: "a" or "b", two tissue classes differing in nuclei density/size and stain hue.
    texture: "procedural" (default), "real" (H&E pixels from CMU-1-Small-Region.svs, via `real_source`
        or ../shared/data/slides), or "auto" (real when that slide is found, else procedural).
    tissue_boxes_um / blur_boxes_um: explicit scene; default `default_scene(width_um, height_um, seed)`.
    n_levels: pyramid levels (halving each time); default until the smallest fits in one tile.
    write_mpp: False writes no MPP and no resolution tags (a slide the pipeline must refuse).
    corrupt_tiles: level-0 (col, row) tile indices whose JPEG bytes are damaged so decoding them fails
        (only level 0: coarser levels keep an intact copy of that area).
    bigtiff: 64-bit offsets; default when the uncompressed pixels exceed 2 GiB.
    """
    if style not in _STYLES:
        raise ValueError(f"style must be one of {sorted(_STYLES)}, not {style!r}")
    if mpp <= 0 or not math.isfinite(mpp):
        raise ValueError(f"mpp must be a positive number of um/px, not {mpp!r}")
    width_um, height_um = (size_um, size_um) if isinstance(size_um, int | float) else size_um
    w, h = round(width_um / mpp), round(height_um / mpp)
    if w < 1 or h < 1:
        raise ValueError(f"size_um {size_um!r} at mpp {mpp} gives an empty image")
    if tissue_boxes_um is None:
        scene_tissue, scene_blur = default_scene(width_um, height_um, seed=seed)
        tissue_boxes_um = scene_tissue
        blur_boxes_um = scene_blur if blur_boxes_um is None else blur_boxes_um
    blur_boxes_um = list(blur_boxes_um or [])
    tissue = tuple(tuple(float(v) for v in b) for b in tissue_boxes_um)
    blur = tuple(tuple(float(v) for v in b) for b in blur_boxes_um)

    source = Path(real_source) if real_source is not None else find_real_he_source()
    if texture == "real" and (source is None or not source.is_file()):
        raise FileNotFoundError(f"texture='real' needs {_REAL_SOURCE_NAME}; not found (give real_source=)")
    used_texture = "real" if texture == "real" or (texture == "auto" and source is not None) else "procedural"
    atlas, blurred, atlas_mpp = _texture(used_texture, style, str(source) if used_texture == "real" else None)
    # where each tissue box starts in the texture: a multiple of 64 um, a whole number of pixels at every
    # level of 0.25 * 2**k um/px (k <= 8), so all levels show the same content at the same micrometres
    rng = np.random.default_rng([seed, 7])
    offsets = [tuple(64.0 * rng.integers(0, round(_PERIOD_UM / 64), 2)) for _ in tissue]
    painter = _Painter(tissue, blur, offsets, atlas, blurred, atlas_mpp)

    if n_levels is None:
        n_levels = 1
        while max(w, h) / 2 ** (n_levels - 1) > tile_px:
            n_levels += 1
    thumb_mpp = mpp * max(w, h) / min(768, max(w, h))
    tw, th = max(1, round(width_um / thumb_mpp)), max(1, round(height_um / thumb_mpp))
    res = (1e4 / mpp, 1e4 / mpp) if write_mpp else None
    common = {"photometric": "rgb", "compression": "jpeg", "compressionargs": {"level": jpeg_quality}}

    with atomic_path(Path(path)) as tmp:
        big = w * h * 3 > 2**31 if bigtiff is None else bigtiff
        with tifffile.TiffWriter(tmp, bigtiff=big) as tif:
            for level in range(n_levels):
                if level == 1:  # Aperio puts a stripped thumbnail in IFD 1; tifffile and openslide expect it
                    tif.write(painter.render(0, 0, tw, th, thumb_mpp), photometric="rgb", compression="jpeg",
                              compressionargs={"level": 80}, rowsperstrip=16, subfiletype=0)
                lw, lh = math.ceil(w / 2**level), math.ceil(h / 2**level)
                lmpp = mpp * 2**level
                tif.write(
                    _tiles(painter, lw, lh, tile_px, lmpp),
                    shape=(lh, lw, 3),
                    dtype=np.uint8,
                    tile=(tile_px, tile_px),
                    description=_aperio_description(w, h, tile_px, jpeg_quality, mpp if write_mpp else None)
                    if level == 0
                    else None,
                    resolution=(res[0] / 2**level, res[1] / 2**level) if res else None,
                    resolutionunit="CENTIMETER" if res else None,
                    subfiletype=0,
                    metadata=None,
                    **common,
                )
        if corrupt_tiles:
            _damage_tiles(tmp, corrupt_tiles)
    log.debug("wrote %s (%dx%d px at %s um/px, %d levels)", path, w, h, mpp, n_levels)
    return SampleSlide(
        path=Path(path), mpp=mpp, width_px=w, height_px=h, tissue_boxes_um=tissue, blur_boxes_um=blur,  # type: ignore[arg-type]
        style=style, texture=used_texture, seed=seed, tile_px=tile_px, n_levels=n_levels,
        mpp_written=write_mpp, corrupt_tiles=tuple((int(c), int(r)) for c, r in corrupt_tiles),
    )


def _damage_tiles(path: Path, tiles: Sequence[tuple[int, int]]) -> None:
    """Overwrite the JPEG start of the given level-0 tiles, so every decoder refuses them."""
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        n_cols = math.ceil(page.imagewidth / page.tilewidth)
        n_rows = math.ceil(page.imagelength / page.tilelength)
        offsets = page.dataoffsets
    with open(path, "r+b") as fh:
        for col, row in tiles:
            if not (0 <= col < n_cols and 0 <= row < n_rows):
                raise ValueError(f"corrupt tile ({col}, {row}) is outside the {n_cols}x{n_rows} tile grid")
            fh.seek(offsets[row * n_cols + col])
            fh.write(b"\x00" * 64)


def write_truncated_copy(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], *, keep_fraction: float = 0.5
) -> Path:
    """Copy the first `keep_fraction` of a slide's bytes (a download or copy that stopped midway)."""
    src, dst = Path(src), Path(dst)
    left = int(src.stat().st_size * keep_fraction)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while left > 0 and (chunk := fin.read(min(left, 1 << 20))):
            fout.write(chunk)
            left -= len(chunk)
    return dst


def write_sample_cohort(
    out_dir: str | os.PathLike[str],
    *,
    n: int,
    size_um: float | tuple[float, float] = 1500.0,
    mpp: float = 0.5,
    styles: Sequence[Style] = ("a",),
    texture: Texture = "procedural",
    seed: int = 0,
    prefix: str = "sample",
    tile_px: int = 256,
    write_mpp: bool = True,
    progress: bool = False,
) -> list[SampleSlide]:
    """`n` slides `<prefix>-NNN.svs`, cycling through `styles`, each with its own seed (seed + i).

    Also writes `slides.json` (one `SampleSlide.as_dict()` per slide) so the scene of every slide is
    known later without Python, e.g. which style (class) each slide is.
    """
    from tqdm import tqdm

    from wsi.files import write_text_atomic

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    slides = [
        write_sample_slide(
            out / f"{prefix}-{i:03d}.svs", size_um=size_um, mpp=mpp, style=styles[i % len(styles)],
            texture=texture, seed=seed + i, tile_px=tile_px, write_mpp=write_mpp,
        )
        for i in tqdm(range(n), desc="sample slides", unit="slide", disable=not progress)
    ]
    records = [s.as_dict() for s in slides]
    write_text_atomic(out / "slides.json", json.dumps(records, indent=1) + "\n")
    return slides

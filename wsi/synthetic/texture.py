"""Painting a scene: periodic H&E-like texture atlases and the painter that renders any pixel rectangle.

Content is a seeded function of position in micrometres (a periodic atlas sampled per tile), so the
same scene written at 0.25 and at 0.5 um/px shows the same tissue in the same micrometres, and a slide
of any size is painted tile by tile without holding it in memory. Atlases are procedural (two styles
differing in nuclei density/size and stain hue) or cut from a real H&E slide (CMU-1-Small-Region.svs);
a fluorescence atlas paints a dark-background scan (sparse bright DAPI nuclei on dim FITC tissue).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import fft as sfft
from scipy import ndimage

from wsi.slides.thumbnail import read_thumbnail
from wsi.synthetic.scene import Box

#: resolution at which the procedural texture atlas is built before resampling to each level
_REF_MPP = 0.25
#: period of the procedural texture (micrometres); large enough that repeats are not obvious in a tile
_PERIOD_UM = 512.0
#: near-white slide background (glass), as scanners record it
_BACKGROUND_RGB = (243, 243, 245)
#: the near-black background of a fluorescence scan (no light where there is no dye)
_DARK_BACKGROUND_RGB = (6, 7, 10)
#: blur applied to the blurred regions (Gaussian sigma, micrometres): out of focus at any tile size
_BLUR_SIGMA_UM = 4.0
#: the real H&E slide whose pixels paint "real" textures (looked up in ../shared/data/slides)
REAL_SOURCE_NAME = "CMU-1-Small-Region.svs"
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
#: the tissue styles a slide can be painted in
STYLE_NAMES = tuple(sorted(_STYLES))
#: how a slide was imaged: brightfield H&E, or a two-channel fluorescence scan (DAPI nuclei, FITC tissue)
STAIN_NAMES = ("fluorescence", "he")
#: fluorescence nuclei: sparse (a third of 20 um cells), 3-5 um; DAPI shows blue, FITC autofluorescence green
_FLUO_NUCLEI = _StyleParams(20.0, 0.35, (3.0, 5.0), (0, 0, 0), (0, 0, 0), (0, 0, 0))


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
    mask = _nuclei_mask(p, n, rng)
    out = np.empty((n, n, 3), np.uint8)
    for c in range(3):  # per channel: keeps the temporaries 2-D float32
        chan = p.stroma_rgb[c] + (p.fibre_rgb[c] - p.stroma_rgb[c]) * fibres + cloud
        chan += (p.nucleus_rgb[c] + chromatin - chan) * mask
        chan += grain
        out[..., c] = np.clip(chan, 0, 255)
    return out


def _nuclei_mask(p: _StyleParams, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, n) float32 in [0, 1]: jittered points on a grid of cells, drawn as soft ellipses (wrapped)."""
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
    return mask


def _fluorescence_atlas(style: str) -> np.ndarray:
    """A periodic two-channel fluorescence-like texture, (N, N, 3) uint8 at _REF_MPP, as a viewer shows it:
    DAPI (blue) bright, sparse nuclei with chromatin grain; FITC (green) dim, patchy tissue
    autofluorescence; red empty. Dark wherever there is no dye, like the glass around the tissue."""
    n = round(_PERIOD_UM / _REF_MPP)
    rng = np.random.default_rng(ord(style) + 1000)

    def noise() -> np.ndarray:
        return rng.standard_normal((n, n), dtype=np.float32)

    nuclei = _nuclei_mask(_FLUO_NUCLEI, n, rng)  # (n, n) in [0, 1]
    chromatin = _periodic_blur(noise(), 1.0)
    chromatin *= 0.25 / (chromatin.std() + 1e-9)
    cloud = _periodic_blur(noise(), 24.0)
    cloud = np.clip(cloud * (0.5 / (cloud.std() + 1e-9)) + 0.5, 0, 1)  # patchy cytoplasm, 0..1
    grain = noise() * 2.0
    dapi = _DARK_BACKGROUND_RGB[2] + 210.0 * nuclei * (0.85 + chromatin) + grain
    fitc = _DARK_BACKGROUND_RGB[1] + 20.0 + 45.0 * cloud + 30.0 * nuclei + grain
    red = _DARK_BACKGROUND_RGB[0] + 4.0 * cloud + grain
    return np.clip(np.stack([red, fitc, dapi], axis=-1), 0, 255).astype(np.uint8)


@functools.lru_cache(maxsize=4)
def _atlases(kind: str, style: str, source: str | None) -> tuple[np.ndarray, np.ndarray, float]:
    """(sharp, out-of-focus, um/px) periodic atlases; built once per process and kind."""
    if kind == "fluorescence":
        atlas, atlas_mpp = _fluorescence_atlas(style), _REF_MPP
    elif kind == "real" and source:
        atlas, atlas_mpp = _real_atlas(Path(source), style), _REAL_MPP
    else:
        atlas, atlas_mpp = _procedural_atlas(style), _REF_MPP
    blurred = np.clip(_periodic_blur(atlas, _BLUR_SIGMA_UM / atlas_mpp) + 0.5, 0, 255).astype(np.uint8)
    atlas.flags.writeable = False
    blurred.flags.writeable = False
    return atlas, blurred, atlas_mpp


def find_real_he_source() -> Path | None:
    """The real H&E slide used to paint tissue, from ../shared/data/slides next to the checkout."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        candidate = root.parent / "shared" / "data" / "slides" / REAL_SOURCE_NAME
        if candidate.is_file():
            return candidate
    return None


def _real_atlas(source: Path, style: str, crop_um: float = 400.0) -> np.ndarray:
    """Real H&E pixels: the crop of `source` with the most tissue, mirrored to tile seamlessly.

    At _REAL_MPP. Style b zooms the texture (larger nuclei) and shifts the stain towards blue-violet, so
    the two classes differ in texture also when painted with real pixels.
    """
    from wsi.slides.slide import open_slide

    zoom = 1.5 if style == "b" else 1.0
    side_um = crop_um / zoom
    step_um = 8.0
    with open_slide(source) as slide:
        thumb = read_thumbnail(slide, step_um).image
        sat = np.asarray(Image.fromarray(thumb).convert("HSV"))[..., 1].astype(np.float32)
        win = max(1, round(side_um / step_um))
        iy = ix = 0
        if sat.shape[0] > win and sat.shape[1] > win:
            # mean saturation of every win x win window, indexed by its top-left corner
            score = ndimage.uniform_filter(sat, size=win, mode="constant", origin=-(win // 2))
            score = score[: sat.shape[0] - win + 1, : sat.shape[1] - win + 1]
            iy, ix = (int(i) for i in np.unravel_index(int(np.argmax(score)), score.shape))
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


def make_painter(
    tissue: Sequence[Box],
    blur: Sequence[Box],
    *,
    texture: str,
    style: str,
    source: Path | None,
    seed: int,
    stain: str = "he",
) -> Painter:
    """The painter of a scene: `texture` "real" paints pixels of `source`, anything else procedural ones;
    `stain` "fluorescence" paints a dark-background fluorescence scan instead (procedural only).

    Each tissue box starts at its own place in the texture: a multiple of 64 um, a whole number of pixels
    at every level of 0.25 * 2**k um/px (k <= 8), so all levels show the same content at the same um.
    """
    if stain not in STAIN_NAMES:
        raise ValueError(f"stain must be one of {list(STAIN_NAMES)}, not {stain!r}")
    kind = "fluorescence" if stain == "fluorescence" else texture
    atlas, blurred, atlas_mpp = _atlases(kind, style, str(source) if kind == "real" else None)
    rng = np.random.default_rng([seed, 7])
    offsets = [(64.0 * a, 64.0 * b) for a, b in (rng.integers(0, round(_PERIOD_UM / 64), 2) for _ in tissue)]
    background = _DARK_BACKGROUND_RGB if stain == "fluorescence" else _BACKGROUND_RGB
    return Painter(tissue, blur, offsets, atlas, blurred, atlas_mpp, background)


@dataclass
class Painter:
    """Renders any pixel rectangle of the scene at a given um/px from per-level texture atlases."""

    tissue_boxes_um: Sequence[Box]
    blur_boxes_um: Sequence[Box]
    offsets_um: Sequence[tuple[float, float]]  # per tissue box: where in the texture it starts
    atlas_ref: np.ndarray  # at atlas_mpp
    blurred_ref: np.ndarray
    atlas_mpp: float
    background_rgb: tuple[int, int, int] = _BACKGROUND_RGB  # what lies outside the tissue boxes
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
        tile[:] = self.background_rgb
        for box, (ox_um, oy_um) in zip(self.tissue_boxes_um, self.offsets_um, strict=True):
            self._paint(tile, sharp, box, ox_um, oy_um, x_px, y_px, mpp)
            for blur in self.blur_boxes_um:
                inter = (*np.maximum(box[:2], blur[:2]), *np.minimum(box[2:], blur[2:]))
                if inter[0] < inter[2] and inter[1] < inter[3]:
                    self._paint(tile, blurred, inter, ox_um, oy_um, x_px, y_px, mpp)
        return tile

    @staticmethod
    def _paint(
        tile: np.ndarray,
        atlas: np.ndarray,
        box: Sequence[float],
        ox_um: float,
        oy_um: float,
        x_px: int,
        y_px: int,
        mpp: float,
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

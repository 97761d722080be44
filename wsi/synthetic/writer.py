"""Writing generated slides: pyramidal, tiled, JPEG-compressed Aperio-style TIFFs, and damaged copies.

File layout (what Aperio scanners write, so both readers take the Aperio path): IFD 0 the tiled level 0
with an `Aperio Image Library` ImageDescription carrying `MPP = ...`; IFD 1 a small stripped thumbnail;
IFD 2.. the tiled, halved pyramid levels. Resolution tags (pixels per centimetre) are written as well.
Every level is written tile by tile from the painter, so a slide of any size fits in memory.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import tifffile

from wsi.core.errors import ConfigError
from wsi.core.files import atomic_path, write_text_atomic
from wsi.synthetic.scene import Box, CohortSettings, SampleSlide, Stain, Style, Texture, as_box, default_scene
from wsi.synthetic.texture import REAL_SOURCE_NAME, STYLE_NAMES, Painter, find_real_he_source, make_painter

log = logging.getLogger(__name__)

#: a sample slide's largest side: the largest real scans are about 200,000 px
MAX_SAMPLE_SIDE_PX = 200_000


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
    stain: Stain = "he",
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
    stain: "he" (brightfield H&E on white glass) or "fluorescence": a dark background with sparse bright
        DAPI-like nuclei (blue) on dim FITC-like tissue (green), procedural texture only; the description
        then also carries `Channels = DAPI,FITC` (the metadata hint of a fluorescence scan).
    """
    _check_style_and_mpp(style, mpp)
    width_um, height_um = (size_um, size_um) if isinstance(size_um, int | float) else size_um
    check_sample_size(width_um, height_um, mpp, tile_px)
    w, h = round(width_um / mpp), round(height_um / mpp)
    tissue, blur = _scene(width_um, height_um, seed, tissue_boxes_um, blur_boxes_um)
    used_texture, source = _texture(texture, stain, real_source)
    painter = make_painter(
        tissue, blur, texture=used_texture, style=style, source=source, seed=seed, stain=stain
    )
    slide = SampleSlide(
        path=Path(path), mpp=mpp, width_px=w, height_px=h, tissue_boxes_um=tissue, blur_boxes_um=blur,
        style=style, texture=used_texture, seed=seed, tile_px=tile_px,
        n_levels=_levels(w, h, tile_px) if n_levels is None else n_levels, mpp_written=write_mpp,
        corrupt_tiles=tuple((int(c), int(r)) for c, r in corrupt_tiles), stain=stain,
    )  # fmt: skip
    with atomic_path(Path(path)) as tmp:
        big = w * h * 3 > 2**31 if bigtiff is None else bigtiff
        _write_pyramid(tmp, painter, slide, (width_um, height_um), jpeg_quality=jpeg_quality, bigtiff=big)
        if corrupt_tiles:
            _damage_tiles(tmp, corrupt_tiles)
    log.debug("wrote %s (%dx%d px at %s um/px, %d levels)", path, w, h, mpp, slide.n_levels)
    return slide


def _check_style_and_mpp(style: str, mpp: float) -> None:
    """A style the painter knows and a usable resolution, before any pixel is painted."""
    if style not in STYLE_NAMES:
        raise ValueError(f"style must be one of {list(STYLE_NAMES)}, not {style!r}")
    if mpp <= 0 or not math.isfinite(mpp):
        raise ValueError(f"mpp must be a positive number of um/px, not {mpp!r}")


def _scene(
    width_um: float, height_um: float, seed: int, tissue_boxes_um: Sequence[Box] | None,
    blur_boxes_um: Sequence[Box] | None,
) -> tuple[tuple[Box, ...], tuple[Box, ...]]:  # fmt: skip
    """(tissue boxes, blur boxes) in um: the given ones, else the seeded default scene (whose blur a
    given blur list replaces)."""
    if tissue_boxes_um is None:
        scene_tissue, scene_blur = default_scene(width_um, height_um, seed=seed)
        tissue_boxes_um = scene_tissue
        blur_boxes_um = scene_blur if blur_boxes_um is None else blur_boxes_um
    tissue = tuple(as_box(b) for b in tissue_boxes_um)
    blur = tuple(as_box(b) for b in blur_boxes_um or [])
    return tissue, blur


def _texture(
    texture: Texture, stain: Stain, real_source: str | os.PathLike[str] | None
) -> tuple[str, Path | None]:
    """(the texture painted: "real" or "procedural", the real H&E source if one is found). Fluorescence
    is always procedural: the real H&E source has no fluorescence counterpart."""
    source = Path(real_source) if real_source is not None else find_real_he_source()
    if texture == "real" and (source is None or not source.is_file()):
        raise FileNotFoundError(f"texture='real' needs {REAL_SOURCE_NAME}; not found (give real_source=)")
    used = "real" if texture == "real" or (texture == "auto" and source is not None) else "procedural"
    return ("procedural" if stain == "fluorescence" else used), source


def _levels(w: int, h: int, tile_px: int) -> int:
    """Pyramid levels, halving each time, until the smallest fits in one tile."""
    n_levels = 1
    while max(w, h) / 2 ** (n_levels - 1) > tile_px:
        n_levels += 1
    return n_levels


def check_sample_size(width_um: float, height_um: float, mpp: float, tile_px: int = 256) -> None:
    """ConfigError naming --size-um and --mpp when a sample slide would be empty or larger than
    MAX_SAMPLE_SIDE_PX a side (tifffile would try to list billions of tiles: a raw MemoryError)."""
    if not all(math.isfinite(v) for v in (width_um, height_um, mpp)) or mpp <= 0:
        raise ConfigError(f"--size-um {width_um!r} x {height_um!r} at --mpp {mpp!r}: give positive numbers")
    w, h = round(width_um / mpp), round(height_um / mpp)
    if w < 1 or h < 1:
        raise ConfigError(f"--size-um {width_um:g} x {height_um:g} at --mpp {mpp:g} gives an empty image")
    if max(w, h) > MAX_SAMPLE_SIDE_PX:
        tiles = math.ceil(w / tile_px) * math.ceil(h / tile_px)
        raise ConfigError(
            f"--size-um {max(width_um, height_um):g} at --mpp {mpp:g} makes slides of {w} x {h} px "
            f"({w * h * 3 / 1e12:.3g} TB of pixels, {tiles:,} file tiles); sample slides are at most "
            f"{MAX_SAMPLE_SIDE_PX} px a side (the largest scans): lower --size-um or raise --mpp"
        )


def check_prefix(prefix: str) -> None:
    """ConfigError unless `prefix` is a plain file-name part: `../evil` or `/tmp/x` would write the
    slides outside --out (and record paths that are not there)."""
    if not prefix or prefix.startswith(".") or any(c in prefix for c in "/\\\0:"):
        raise ConfigError(
            f"--prefix {prefix!r} must be a plain file-name part (no folder separator, colon or leading "
            "dot): the slides are written into --out as PREFIX-NNN.svs"
        )


def _write_pyramid(
    tmp: Path, painter: Painter, slide: SampleSlide, size_um: tuple[float, float], *, jpeg_quality: int,
    bigtiff: bool,
) -> None:  # fmt: skip
    """Level 0, the Aperio thumbnail (IFD 1), then the halved levels, each streamed tile by tile."""
    w, h, mpp, tile_px = slide.width_px, slide.height_px, slide.mpp, slide.tile_px
    thumb_mpp = mpp * max(w, h) / min(768, max(w, h))
    tw, th = max(1, round(size_um[0] / thumb_mpp)), max(1, round(size_um[1] / thumb_mpp))
    res = (1e4 / mpp, 1e4 / mpp) if slide.mpp_written else None
    channels = ("DAPI", "FITC") if slide.stain == "fluorescence" else ()
    with tifffile.TiffWriter(tmp, bigtiff=bigtiff) as tif:
        for level in range(slide.n_levels):
            if level == 1:  # Aperio puts a stripped thumbnail in IFD 1; tifffile and openslide expect it
                tif.write(
                    painter.render(0, 0, tw, th, thumb_mpp), photometric="rgb", compression="jpeg",
                    compressionargs={"level": 80}, rowsperstrip=16, subfiletype=0,
                )  # fmt: skip
            lw, lh = math.ceil(w / 2**level), math.ceil(h / 2**level)
            tif.write(
                _tiles(painter, lw, lh, tile_px, mpp * 2**level),
                shape=(lh, lw, 3),
                dtype=np.uint8,
                tile=(tile_px, tile_px),
                description=_aperio_description(
                    w, h, tile_px, jpeg_quality, mpp if slide.mpp_written else None, channels
                )
                if level == 0
                else None,
                resolution=(res[0] / 2**level, res[1] / 2**level) if res else None,
                resolutionunit="CENTIMETER" if res else None,
                subfiletype=0,
                metadata=None,
                photometric="rgb",
                compression="jpeg",
                compressionargs={"level": jpeg_quality},
            )


def _aperio_description(
    w: int, h: int, tile_px: int, quality: int, mpp: float | None, channels: Sequence[str] = ()
) -> str:
    text = (
        f"Aperio Image Library v12.0.0 (wsi sample)\r\n"
        f"{w}x{h} [0,0 {w}x{h}] ({tile_px}x{tile_px}) JPEG/RGB Q={quality}"
    )
    fields = [text, f"AppMag = {round(10 / mpp) if mpp else 20}", "Filename = wsi-sample"]
    if mpp is not None:
        fields.append(f"MPP = {mpp:.6g}")
    if channels:  # openslide shows it as the property aperio.Channels
        fields.append(f"Channels = {','.join(channels)}")
    return "|".join(fields)


def _tiles(painter: Painter, w: int, h: int, tile_px: int, mpp: float) -> Iterator[np.ndarray]:
    for y in range(0, h, tile_px):
        for x in range(0, w, tile_px):
            yield painter.render(x, y, tile_px, tile_px, mpp)


def _damage_tiles(path: Path, tiles: Sequence[tuple[int, int]]) -> None:
    """Overwrite the JPEG start of the given level-0 tiles, so every decoder refuses them."""
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        if not isinstance(page, tifffile.TiffPage):  # IFD 0 is always a full page in our files
            raise ValueError(f"{path}: first IFD is not a TIFF page")
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


_COHORT = CohortSettings()


def write_sample_cohort(
    out_dir: str | os.PathLike[str],
    *,
    n: int,
    size_um: float | tuple[float, float] = _COHORT.size_um,
    mpp: float = _COHORT.mpp,
    styles: Sequence[Style] = _COHORT.styles,
    texture: Texture = _COHORT.texture,
    seed: int = _COHORT.seed,
    prefix: str = _COHORT.prefix,
    tile_px: int = _COHORT.tile_px,
    write_mpp: bool = _COHORT.write_mpp,
    progress: bool = False,
) -> list[SampleSlide]:
    """`n` slides `<prefix>-NNN.svs`, cycling through `styles`, each with its own seed (seed + i); the
    defaults are CohortSettings's (`wsi make-slides`).

    Also writes `slides.json` (one `SampleSlide.to_dict()` per slide) so the scene of every slide is
    known later without Python, e.g. which style (class) each slide is.
    """
    from wsi.core.progress import progress as progress_bar

    check_prefix(prefix)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    slides = [
        write_sample_slide(
            out / f"{prefix}-{i:03d}.svs", size_um=size_um, mpp=mpp, style=styles[i % len(styles)],
            texture=texture, seed=seed + i, tile_px=tile_px, write_mpp=write_mpp,
        )
        for i in progress_bar(range(n), desc="sample slides", unit="slide", disable=not progress)
    ]  # fmt: skip
    records = [s.to_dict() for s in slides]
    write_text_atomic(out / "slides.json", json.dumps(records, indent=1) + "\n")
    return slides

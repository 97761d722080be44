"""`--stain-norm` / `--stain-reference`: the stain reference of a run, and what a bag records about it.

The reference is resolved once, before any work (a bad file is a usage error, not N failed slides), and
travels to dask workers as data. It is either the method's shipped default (models/encoders/stain.py), a saved
reference (.json, `models.encoders.stain.save_reference`), or fitted from tiles: an image, a folder of images,
or a tile file of `wsi tile` (its tiles read from the --save-tiles cache when complete, else from the slide).

Public API:
  resolve_stain_reference(method, path) -> StainReference | None     None: no stain normalisation
  stain_fields(reference, fallback_tiles) -> dict   the BagProvenance fields of a bag (all None without)
  MAX_FIT_TILES                                     tiles a reference is fitted on, at most (evenly spaced)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TypedDict

import numpy as np
import torch

from wsi.core.config import config_dict
from wsi.core.errors import ConfigError, WsiError
from wsi.core.json_types import JsonObject
from wsi.core.suffixes import PHOTO_SUFFIXES
from wsi.models.encoders.stain import StainReference, default_reference, fit_reference, load_reference

log = logging.getLogger(__name__)

MAX_FIT_TILES = 128  # evenly spaced over the source: enough for stable percentiles, ~100 MB as float
FIT_TILE_PX = 256  # images are cut into squares of this side (or of their shorter side, when smaller)


def resolve_stain_reference(method: str | None, path: str | Path | None) -> StainReference | None:
    """The reference tiles are mapped onto, or None when `method` is None (no stain normalisation)."""
    if method is None:
        if path is not None:
            raise ConfigError("--stain-reference needs --stain-norm macenko|reinhard")
        return None
    default = default_reference(method)  # validates the method
    if path is None:
        return default
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"--stain-reference {path} does not exist; give a .json reference, an image, "
                          "a folder of images or a tile file (tiles/<slide_id>.h5)")  # fmt: skip
    if path.suffix.lower() == ".json":
        ref = load_reference(path)
        if ref.method != method:
            raise ConfigError(f"--stain-reference {path} is a {ref.method} reference, not {method}")
        return ref
    tiles = _reference_tiles(path)
    ref = fit_reference(method, torch.from_numpy(tiles), source=f"fitted on {path} ({len(tiles)} tiles)")
    log.info("stain reference (%s) fitted on %d tiles of %s", method, len(tiles), path)
    return ref


def _reference_tiles(path: Path) -> np.ndarray:
    """(N, S, S, 3) uint8 tiles of an image, a folder of images, or a tile file."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in PHOTO_SUFFIXES)
        if not files:
            kinds = ", ".join(PHOTO_SUFFIXES)
            raise ConfigError(f"--stain-reference {path}: no images ({kinds}) in the folder")
        return _crops([_read_image(p) for p in files])
    if path.suffix.lower() in PHOTO_SUFFIXES:
        return _crops([_read_image(path)])
    from wsi.formats.tile_file import is_tile_file

    if is_tile_file(path):
        return _tile_file_tiles(path)
    raise ConfigError(
        f"--stain-reference {path}: not a .json reference, an image ({', '.join(PHOTO_SUFFIXES)}), a folder "
        "of images or a tile file of `wsi tile`"
    )


def _read_image(path: Path) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, Image.DecompressionBombError) as exc:
        raise ConfigError(
            f"--stain-reference {path}: not a readable image ({exc}); for a whole slide give its tile file "
            "(tiles/<slide_id>.h5)"
        ) from None


def _crops(images: list[np.ndarray]) -> np.ndarray:
    """Every image cut into squares of one side (the images' shorter side when under FIT_TILE_PX)."""
    side = min(FIT_TILE_PX, *(min(im.shape[:2]) for im in images))
    if side < 16:
        raise ConfigError(f"--stain-reference: an image of {side} px is too small to fit stains on")
    crops = [
        im[y : y + side, x : x + side]
        for im in images
        for y in range(0, im.shape[0] - side + 1, side)
        for x in range(0, im.shape[1] - side + 1, side)
    ]
    return _evenly(np.stack(crops))


def _evenly(tiles: np.ndarray) -> np.ndarray:
    if len(tiles) <= MAX_FIT_TILES:
        return tiles
    return tiles[np.linspace(0, len(tiles) - 1, MAX_FIT_TILES).round().astype(int)]


def _tile_file_tiles(path: Path) -> np.ndarray:
    """Up to MAX_FIT_TILES tiles of a tile file, evenly spaced: from its pixel cache, else from the slide."""
    from wsi.core.suffixes import TILE_PIXELS_SUFFIX
    from wsi.formats.tile_file import open_tile_pixels, pixels_complete, read_tile_file
    from wsi.slides.slide import open_slide

    try:
        tf = read_tile_file(path)
        if len(tf) == 0:
            raise ConfigError(f"--stain-reference {path}: the tile file holds no tiles")
        pick = np.unique(np.linspace(0, len(tf) - 1, min(len(tf), MAX_FIT_TILES)).round().astype(int))
        cache = path.with_suffix(TILE_PIXELS_SUFFIX)
        if pixels_complete(cache, len(tf)):
            array = open_tile_pixels(cache)
            return np.stack([np.asarray(array[int(i)]) for i in pick])
        backend = tf.meta.backend
        with open_slide(tf.slide_path, backend=backend, mpp=tf.mpp) as slide:
            size_um, mpp = tf.tile_um, tf.target_mpp
            return np.stack([slide.read_region_um(int(x), int(y), size_um, mpp) for x, y in tf.coords[pick]])
    except ConfigError:
        raise
    except WsiError as exc:
        raise ConfigError(f"--stain-reference {path}: {exc}") from None


class StainFields(TypedDict):
    """The BagProvenance fields about stain normalisation (all None without it)."""

    stain_norm: str | None
    stain_reference: JsonObject | None
    stain_reference_sha256: str | None
    stain_fallback_tiles: int | None


def stain_fields(reference: StainReference | None, fallback_tiles: int | None) -> StainFields:
    """What a bag records about stain normalisation (BagProvenance fields), None everywhere without it."""
    if reference is None:
        return {"stain_norm": None, "stain_reference": None, "stain_reference_sha256": None,
                "stain_fallback_tiles": None}  # fmt: skip
    return {
        "stain_norm": reference.method,
        "stain_reference": config_dict(reference),
        "stain_reference_sha256": reference.digest(),
        "stain_fallback_tiles": fallback_tiles,
    }


__all__ = ["MAX_FIT_TILES", "StainFields", "resolve_stain_reference", "stain_fields"]

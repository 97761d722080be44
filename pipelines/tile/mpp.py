"""Which mpp a slide is tiled at: a slide list's `mpp` column, the metadata, or --mpp, and saying which.

    open_with_mpp(source, backend, fallback_mpp, override) -> (Slide, mpp_source, note)
    refuse_images_without_mpp(sources, fallback_mpp, done)   before any slide: plain images need an mpp

Order: a slide list's `mpp` column (per slide, always); then `--mpp` with `--mpp-override` (the user's
value over the metadata, for a scanner known to write a wrong one); then the metadata; then `--mpp` for a
slide without one. Given `--mpp` for a slide with metadata and no override, the metadata wins and the log
says so, naming both values and the option that forces --mpp.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from wsi.core.errors import MissingMppError, SlideError
from wsi.pipelines.tile.checks import ignored_fallback_mpp, mpp_disagreement
from wsi.slides.plain_images import MPP_FIX, image_mpp_hint, is_image_slide, read_image_header
from wsi.slides.slide import Slide, open_slide
from wsi.slides.sources import SlideSource

log = logging.getLogger("wsi.pipelines.tile")

#: `mpp_source` of a slide tiled at --mpp with --mpp-override (stored in the tile file)
OVERRIDE_SOURCE = "--mpp-override"


def open_with_mpp(
    source: SlideSource, backend: str, fallback_mpp: float | None, override: bool = False
) -> tuple[Slide, str, str]:
    """The open slide, where its mpp came from ("slide list", "--mpp-override", "metadata" or "--mpp"),
    and a warning ("" if none) when a given mpp is more than 2x from the slide's metadata."""
    if source.mpp is not None:
        slide = open_slide(source.path, backend=backend, mpp=source.mpp)
        note = mpp_disagreement(source.mpp, metadata_mpp(source.path, backend), "the slide list (mpp column)")
        _warn(source, note)
        return slide, "slide list", note
    if override and fallback_mpp is not None:
        slide = open_slide(source.path, backend=backend, mpp=fallback_mpp)
        found = metadata_mpp(source.path, backend)
        if found is not None and abs(found - fallback_mpp) > 1e-9 * max(found, fallback_mpp):
            log.info(
                "%s: --mpp %g wins over the metadata's %g um/px (--mpp-override)",
                source.slide_id,
                fallback_mpp,
                found,
            )
        return slide, OVERRIDE_SOURCE, mpp_disagreement(fallback_mpp, found, "--mpp (with --mpp-override)")
    try:
        slide = open_slide(source.path, backend=backend)
    except MissingMppError:
        if fallback_mpp is None:
            raise
        return open_slide(source.path, backend=backend, mpp=fallback_mpp), "--mpp", ""
    if fallback_mpp is not None and abs(fallback_mpp - slide.mpp) > 1e-9 * max(slide.mpp, fallback_mpp):
        far = ignored_fallback_mpp(fallback_mpp, slide.mpp)
        if far:
            _warn(source, far + "; or add --mpp-override to use --mpp for every slide")
        else:
            log.info(
                "%s: the metadata's %g um/px wins over --mpp %g (--mpp serves slides without one; "
                "--mpp-override forces it)", source.slide_id, slide.mpp, fallback_mpp,
            )  # fmt: skip
    return slide, "metadata", ""


def refuse_images_without_mpp(
    sources: Sequence[SlideSource], fallback_mpp: float | None, done: Callable[[SlideSource], bool]
) -> None:
    """MissingMppError (the command exits 2, before any slide is read) naming the plain images (PNG,
    JPEG, TIFF in strips) that have no mpp from a slide list, --mpp or a trusted resolution in their
    header: a forgotten --mpp, not one bad slide. Images whose tiles are `done` are left to resume."""
    if fallback_mpp is not None:
        return
    missing: list[tuple[Path, str]] = []
    for src in sources:
        if src.mpp is not None or src.error or not isinstance(src.path, Path) or not src.path.is_file():
            continue
        if not is_image_slide(src.path) or done(src):
            continue
        try:
            header = read_image_header(src.path)
        except SlideError:  # unreadable: fails on its own in the batch, with its reason
            continue
        if header.mpp is None:
            missing.append((src.path, image_mpp_hint(src.path, header)))
    if len(missing) == 1:
        raise MissingMppError(missing[0][1])
    if missing:
        named = ", ".join(str(path) for path, _ in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise MissingMppError(
            f"{len(missing)} plain images have no trustworthy resolution in their metadata: {named}; "
            f"{MPP_FIX}"
        )


def _warn(source: SlideSource, note: str) -> None:
    if note:
        log.warning("%s: %s", source.slide_id, note)


def metadata_mpp(path: Path | str, backend: str) -> float | None:
    """The slide's own mpp, None when its metadata has none (a second, cheap open: `Slide` keeps only the
    mpp in use)."""
    try:
        with open_slide(path, backend=backend) as slide:
            return slide.mpp
    except SlideError:
        return None


__all__ = ["OVERRIDE_SOURCE", "metadata_mpp", "open_with_mpp", "refuse_images_without_mpp"]

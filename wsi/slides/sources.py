"""Turn what the user typed (slide files, folders, CSV slide lists) into slide records.

A missing command-line PATH, a CSV without a `path` column or two slides with one id are user
mistakes found before any work starts (WsiError). A CSV row whose file is missing or broken is not: it
becomes a record that fails in the batch, so one bad row never blocks the others. Neither is a slide
whose id cannot be made a file name (a file named `!!!.svs`, a `slide_id` of `---`): its record keeps
the name as given and says why in `error`; the stages refuse that one slide (the tile stage's id check
fails it, naming the file) and run the others.
"""

from __future__ import annotations

import csv
import io
import math
import os
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from wsi.core.config import MAX_MPP
from wsi.core.errors import SlideIdError, WsiError
from wsi.core.files import is_temp_name, sanitize_slide_id, slide_name_from_path
from wsi.core.suffixes import DICOM_SLIDE_SUFFIX, FOLDER_SLIDE_SUFFIXES, NAMED_SLIDE_SUFFIXES
from wsi.core.user_text import check_header, read_utf8
from wsi.slides.dicom_series import find_series
from wsi.storage import Url, local_file, location
from wsi.storage.listing import remote_slides


@dataclass(frozen=True)
class SlideSource:
    """One slide to process. `mpp` (level-0 um/px) overrides the slide's metadata when given.

    `error` non-empty: the slide cannot be processed (its id is unusable); `slide_id` is then the name
    as given, for the failed manifest row, and must never become a file name.
    """

    slide_id: str
    path: Path | Url  # a local file, or a remote one (s3://, gs://, https://; `wsi.storage`)
    mpp: float | None = None
    error: str = ""


def _source(name: str, path: Path | Url, mpp: float | None = None, where: str = "") -> SlideSource:
    """A record for `path` with the id made from `name`; an unusable id gives a record with `error`."""
    try:
        return SlideSource(sanitize_slide_id(name), path, mpp)
    except SlideIdError as exc:
        return SlideSource(unicodedata.normalize("NFC", name), path, mpp, error=f"{where or path}: {exc}")


def find_slides(paths: Iterable[str | os.PathLike[str]]) -> list[SlideSource]:
    """Slide records for PATHs: slide files, folders (searched recursively for the suffixes in
    `wsi.core.suffixes.FOLDER_SLIDE_SUFFIXES`, and for DICOM whole-slide series: one slide per series, named
    after its folder) and CSV slide lists. A plain image (PNG, JPEG) is a slide when named, as a PATH or
    a CSV row, never when found in a folder (`wsi.core.suffixes`). Each may be a URL (s3://bucket/slides/, a
    slide's URL, a CSV's URL: `_from_remote`)."""
    sources: list[SlideSource] = []
    for raw in paths:
        where = location(raw, what="slides")
        if isinstance(where, Url):
            sources.extend(_from_remote(where))
            continue
        path = where.expanduser()
        if not path.exists():
            raise WsiError(f"{path}: no such file or folder; give a slide, a folder of slides or a CSV")
        if path.is_dir():
            sources.extend(_from_folder(path))
        elif path.suffix.lower() == ".csv":
            sources.extend(_from_csv(path))
        else:
            sources.append(_source(slide_name_from_path(path), path.absolute()))
    return _dedupe(sources)


def _from_folder(folder: Path) -> list[SlideSource]:
    """Slide files under `folder`, and one slide per DICOM whole-slide series (`wsi.slides.dicom_series`)."""
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.suffix.lower() in (*FOLDER_SLIDE_SUFFIXES, DICOM_SLIDE_SUFFIX)
        and not is_temp_name(p)
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        and (p.is_file() or p.is_symlink())
    )
    found = [_source(slide_name_from_path(p), p.absolute()) for p in files if p.suffix.lower() != ".dcm"]
    dicom = [p for p in files if p.suffix.lower() == DICOM_SLIDE_SUFFIX]
    if dicom:
        found += [_source(s.name, s.path.absolute()) for s in find_series(dicom)]
    return sorted(found, key=lambda src: str(src.path))


def _from_remote(url: Url) -> list[SlideSource]:
    """A remote slide, CSV slide list, or folder (listed: one request per 1000 files, nothing read)."""
    suffix = url.suffix.lower()
    if suffix == ".csv":
        return _from_csv(local_file(url, what="slide list"), base=url.parent)
    if suffix in NAMED_SLIDE_SUFFIXES:  # a slide, or a plain image named as one
        return [_source(slide_name_from_path(url.name), url)]
    return [_source(name, found) for name, found in remote_slides(url)]


def _from_csv(csv_path: Path, base: Path | Url | None = None) -> list[SlideSource]:
    """Slides of a CSV list (paths or URLs); relative paths are taken from `base` (the CSV's folder, or
    for a remote CSV its URL's)."""
    text = read_utf8(csv_path, what="slide list", error=WsiError)  # names the first non-UTF-8 byte
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        columns = [c.strip() for c in check_header(reader.fieldnames, str(csv_path), error=WsiError)]
        if "path" not in columns:
            raise WsiError(
                f"{csv_path}: a slide list needs a `path` column (optional: slide_id, mpp); "
                f"found columns {columns}"
            )
        rows = []
        for line, row in enumerate(reader, start=2):
            if None in row:  # DictReader puts surplus fields under None
                raise WsiError(
                    f"{csv_path} line {line}: more fields than columns; quote paths that contain commas"
                )
            rows.append({(k or "").strip(): (v or "").strip() for k, v in row.items()})
    except csv.Error as exc:  # a cell over csv's field limit (128 KiB), a quote never closed
        raise WsiError(f"{csv_path}: cannot read the slide list ({exc})") from None
    sources = []
    for line, row in enumerate(rows, start=2):
        if not row.get("path"):
            raise WsiError(f"{csv_path} line {line}: empty `path`")
        path = _row_path(row["path"], csv_path.parent if base is None else base)
        name = row["slide_id"] if row.get("slide_id") else slide_name_from_path(path.name)
        mpp = _parse_mpp(row.get("mpp", ""), csv_path, line)
        sources.append(_source(name, path, mpp, where=f"{csv_path} line {line} ({path})"))
    return sources


def _row_path(text: str, base: Path | Url) -> Path | Url:
    """A slide list's `path`: a URL as it is, a relative path from `base`, an absolute one made so."""
    given = location(text, what="slide")
    if isinstance(given, Url):
        return given
    given = given.expanduser()
    if given.is_absolute():
        return given.absolute()
    return base / given.as_posix() if isinstance(base, Url) else (base / given).absolute()


def _parse_mpp(text: str, csv_path: Path, line: int) -> float | None:
    if not text:
        return None
    try:
        mpp = float(text)
    except ValueError:
        mpp = float("nan")
    if not (math.isfinite(mpp) and 0 < mpp <= MAX_MPP):
        raise WsiError(f"{csv_path} line {line}: mpp {text!r} is not a number of um/px in (0, {MAX_MPP:g}]")
    return mpp


def _dedupe(sources: list[SlideSource]) -> list[SlideSource]:
    """Drop exact repeats (the same file listed twice); refuse two different slides with one id."""
    by_id: dict[str, SlideSource] = {}
    clashes: dict[str, set[str]] = {}
    for src in sources:
        if src.error:  # refused on its own by the stage; its name is not an id that can clash
            by_id.setdefault(f"\0{src.path}", src)
            continue
        seen = by_id.get(src.slide_id)
        if seen is None:
            by_id[src.slide_id] = src
        elif seen.path != src.path or seen.mpp != src.mpp:
            clashes.setdefault(src.slide_id, {str(seen.path)}).add(str(src.path))
    if clashes:
        detail = "; ".join(f"{sid}: {', '.join(sorted(paths))}" for sid, paths in sorted(clashes.items()))
        raise WsiError(
            f"several slides share one slide id ({detail}); rename the files or give a `slide_id` "
            "column in a CSV slide list"
        )
    return list(by_id.values())

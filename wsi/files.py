"""File-system helpers shared by every stage: atomic writes (text, bytes, CSV, JSON), safe slide ids, digests.

Outputs are written under a temporary name in the destination folder and renamed into place, so an
interrupted run never leaves a file that a re-run would mistake for a finished one.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from wsi.suffixes import NAMED_ONLY_SUFFIXES

_TMP_MARK = ".tmp-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def temp_sibling(final: Path) -> Path:
    """A unique temporary path next to `final` (same file system, so rename is atomic)."""
    return final.with_name(f".{final.name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def is_temp_name(path: Path) -> bool:
    return path.name.startswith(".") and _TMP_MARK in path.name


@contextmanager
def atomic_path(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `final` (file or folder) in one rename.

    On an exception the temporary output is removed and `final` is left as it was.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(final)
    try:
        yield tmp
        replace_path(tmp, final)
    finally:
        if tmp.exists() or tmp.is_symlink():
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)


def replace_path(tmp: Path, final: Path) -> None:
    """Put the finished `tmp` (file or folder) at `final`, replacing what is there."""
    if final.is_dir() and not final.is_symlink():
        # A folder cannot be replaced in one step: move the old one aside first.
        old = temp_sibling(final)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_csv_atomic(
    path: str | os.PathLike[str], header: Sequence[str], rows: Iterable[Sequence[Any]]
) -> None:
    """The one CSV writer for outputs (manifests, splits, logs, predictions): header, rows, `\\n` lines."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_text_atomic(path, buffer.getvalue())


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> None:
    """The one JSON writer for outputs (config.json, metrics.json, run records)."""
    write_text_atomic(path, json.dumps(data, indent=indent) + "\n")


def sanitize_slide_id(name: str) -> str:
    """Make a slide id safe as a file name: letters, digits, '.', '_' and '-' only, no leading dot.

    Path separators and '..' can never survive, so an id from a CSV cannot escape the output folder.
    """
    cleaned = _UNSAFE.sub("_", name).strip("._-")
    cleaned = cleaned.replace("..", "_")
    if not cleaned:
        raise ValueError(f"slide id {name!r} has no usable characters; give a slide_id column")
    return cleaned[:200]


def slide_id_from_path(path: str | os.PathLike[str]) -> str:
    """The file name without its extension (all of '.ome.tiff'), made safe."""
    name = Path(path).name
    for ext in NAMED_ONLY_SUFFIXES:  # .ome.tiff, .ome.tif
        if name.lower().endswith(ext):
            return sanitize_slide_id(name[: -len(ext)])
    return sanitize_slide_id(Path(name).stem)


def sha256_file(path: str | os.PathLike[str], chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()

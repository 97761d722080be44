"""File-system helpers shared by every stage: atomic writes (text, bytes, CSV, JSON), safe slide ids, digests.

Outputs are written under a temporary name in the destination folder and renamed into place, so an
interrupted run never leaves a file that a re-run would mistake for a finished one.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import io
import json
import os
import re
import shutil
import stat
import unicodedata
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from wsi.core.errors import DiskFullError, InputFileError, SlideIdError
from wsi.core.suffixes import NAMED_ONLY_SUFFIXES

_TMP_MARK = ".tmp-"
_MAX_ID_BYTES = 200  # file systems allow 255 bytes; room for suffixes like ".h5" and temp marks
_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}
)


def temp_sibling(final: Path) -> Path:
    """A unique temporary path next to `final` (same file system, so rename is atomic)."""
    return final.with_name(f".{final.name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def is_temp_name(path: Path) -> bool:
    return path.name.startswith(".") and _TMP_MARK in path.name


_FULL = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "StorageFull", "errno = 28", "errno = 122")


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` says the file system is full: an OSError's errno, or the text HDF5 (h5py), zarr and
    safetensors put in their own exceptions."""
    if isinstance(exc, OSError) and exc.errno in _FULL:
        return True
    return any(text in str(exc) for text in _FULL_TEXT)


def disk_full_error(folder: Path, needed: int | None, what: str, *, at_least: bool = False) -> DiskFullError:
    """'no space left on FOLDER (F MB free) for WHAT, needs about N MB; ...' (the one wording)."""
    try:
        free = f"{shutil.disk_usage(folder).free / 1e6:.1f} MB free"
    except OSError:
        free = "free space unknown"
    need = ""
    if needed:
        need = f", needs {'more than' if at_least else 'about'} {max(needed / 1e6, 0.1):.1f} MB"
    return DiskFullError(
        f"no space left on {folder} ({free}) for {what}{need}: free some space there or choose another "
        "output folder, then run the command again (finished work is kept)"
    )


def ensure_space(folder: str | os.PathLike[str], needed: int, what: str) -> None:
    """Refuse before writing `needed` bytes into `folder` when its file system has not that much free
    (plus 1 MB): a write into a full disk through a memory map dies of SIGBUS, not an exception."""
    folder = Path(folder).absolute()
    existing = next((p for p in (folder, *folder.parents) if p.exists()), folder)
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return
    if free < needed + (1 << 20):
        raise disk_full_error(folder, needed, what)


def _bytes_in(path: Path) -> int:
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size if path.exists() else 0
    except OSError:
        return 0


@contextmanager
def atomic_path(final: str | os.PathLike[str], *, expected_bytes: int | None = None) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `final` (file or folder) in one rename.

    On an exception the temporary output is removed and `final` is left as it was; a full disk becomes a
    DiskFullError naming the folder and what the output needs (`expected_bytes`, else at least what was
    written before the disk filled).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(final)
    try:
        yield tmp
        _honour_umask(tmp)
        replace_path(tmp, final)
    except Exception as exc:
        if isinstance(exc, DiskFullError) or not is_disk_full(exc):
            raise
        written = _bytes_in(tmp)
        needed = max(expected_bytes or 0, written)
        raise disk_full_error(final.parent, needed, final.name, at_least=not expected_bytes) from None
    finally:
        if tmp.exists() or tmp.is_symlink():
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)


def current_umask() -> int:
    """The process's umask, read without changing it where the system tells it (Linux /proc), else by
    setting and restoring it (the only portable way)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _honour_umask(tmp: Path) -> None:
    """Give a finished file the mode a plain `open(..., "w")` would: 0666 (0777 if executable) & ~umask.

    Some writers (safetensors, `tempfile`) create files 0600, so colleagues on shared storage could not
    read checkpoints; every output is written through `atomic_path`, so fixing it here fixes them all.
    A folder (the resume state) has its files fixed; folders themselves are made with mkdir, which
    already honours the umask."""
    umask = current_umask()
    files = [tmp] if tmp.is_file() and not tmp.is_symlink() else []
    if tmp.is_dir() and not tmp.is_symlink():
        files = [Path(root) / name for root, _, names in os.walk(tmp) for name in names]
    for path in files:
        with contextlib.suppress(OSError):  # gone, a link, or not ours to chmod: leave it as made
            if path.is_symlink():
                continue
            mode = path.stat().st_mode & 0o777
            wanted = (0o777 if mode & 0o111 else 0o666) & ~umask
            if mode != wanted:
                os.chmod(path, wanted)


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
    """Make a slide id safe as a file name on every system, keeping what a person would recognise.

    Unicode letters, digits and marks are kept (NFC, so `ä` typed either way is one id), as are `.`,
    `_` and `-`; anything else (path separators, whitespace, `:*?"<>|`, control characters) becomes
    `_`, and `..` never survives, so an id from a CSV cannot escape the output folder. Where making
    it safe changed the name, a short stable hash of the original is appended: `Präparat ä` and
    `Präparat ö` stay apart, and `slide 1` and `slide_1` do too. Raises SlideIdError when nothing
    usable is left.
    """
    original = unicodedata.normalize("NFC", name)
    cleaned = "".join(ch if _keep(ch) else "_" for ch in original)
    cleaned = re.sub(r"_+", "_", cleaned).strip("._-").replace("..", "_")
    if not cleaned or not any(ch.isalnum() for ch in cleaned):
        raise SlideIdError(
            f"slide id {name!r} has no letters or digits to make a file name of; "
            "give the slide a slide_id column in a slide list (CSV) or rename the file"
        )
    if cleaned.split(".")[0].upper() in _RESERVED:
        cleaned = f"{cleaned}_"  # Windows device names (CON, NUL, COM1...) cannot be file names
    if cleaned != original or len(cleaned.encode("utf-8")) > _MAX_ID_BYTES:
        cleaned = f"{_truncate_utf8(cleaned, _MAX_ID_BYTES - 7)}-{short_hash(original)}"
    return cleaned


def short_hash(text: str) -> str:
    """Six hex digits of the text's SHA-256: stable across runs, machines and Python versions."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:6]


def _keep(ch: str) -> bool:
    if ch.isascii():
        return ch.isalnum() or ch in "._-"
    return unicodedata.category(ch)[0] in "LNM"


def _truncate_utf8(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8")[:max_bytes]
    return data.decode("utf-8", errors="ignore")


def case_collisions(ids: Iterable[str]) -> dict[str, list[str]]:
    """Ids that differ only by case (they are one file on macOS and Windows): casefolded -> the ids."""
    groups: dict[str, list[str]] = {}
    for slide_id in ids:
        folded = slide_id.casefold()
        if slide_id not in groups.setdefault(folded, []):
            groups[folded].append(slide_id)
    return {key: group for key, group in groups.items() if len(group) > 1}


def slide_name_from_path(path: str | os.PathLike[str]) -> str:
    """The file name without its extension (all of '.ome.tiff'), as it is (NFC), not yet made safe."""
    name = Path(path).name
    for ext in NAMED_ONLY_SUFFIXES:  # .ome.tiff, .ome.tif
        if name.lower().endswith(ext):
            return unicodedata.normalize("NFC", name[: -len(ext)])
    return unicodedata.normalize("NFC", Path(name).stem)


def slide_id_from_path(path: str | os.PathLike[str]) -> str:
    """The file name without its extension (all of '.ome.tiff'), made safe (SlideIdError if it cannot be)."""
    return sanitize_slide_id(slide_name_from_path(path))


def special_file_kind(path: str | os.PathLike[str]) -> str:
    """What `path` is when it exists but is no regular file or folder ("a pipe (FIFO or <(...))", "a
    device", "a socket"); "" otherwise (a file, a folder, or nothing there). Links are followed."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return ""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return ""
    if stat.S_ISFIFO(mode):
        return "a pipe (a FIFO, or process substitution <(...))"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def special_file_message(path: str | os.PathLike[str], what: str, kind: str) -> str:
    return (
        f"{what} {os.fspath(path)} is {kind}, not a regular file: wsi reads such a file whole and more than "
        "once (its sha256 is recorded beside its content), which a stream cannot give. Save it to a file "
        "first (e.g. cat ... > file) and give that"
    )


def check_regular_file(path: str | os.PathLike[str], what: str = "file") -> None:
    """InputFileError naming `path` when it is a pipe, device or socket: read whole, it would hang
    (/dev/zero, a FIFO nobody writes) or give its bytes once (<(...)), so the second read sees nothing."""
    kind = special_file_kind(path)
    if kind:
        raise InputFileError(special_file_message(path, what, kind))


def is_regular_file(path: str | os.PathLike[str], what: str = "file") -> bool:
    """Whether a regular file is at `path` (links followed): False when nothing (or a folder) is there,
    InputFileError when a pipe, device or socket is, so a per-slide lookup in a folder (`<id>.geojson`)
    names such an entry instead of taking it for absent (`Path.is_file()` is False for it)."""
    check_regular_file(path, what)
    return Path(path).is_file()


def sha256_file(path: str | os.PathLike[str], chunk_bytes: int = 1 << 20) -> str:
    check_regular_file(path)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()

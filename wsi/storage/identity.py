"""Which slide file a path or URL names now: does it exist, is it the file an output was made from.

A tile file and a bag record the slide they were made from by its location and by a fingerprint: its
size, its version (a local file's modification time; a remote object's ETag or generation) and the
sha256 of its first `HEADER_BYTES` bytes (for a TIFF-based slide the header and first IFDs, which name
the dimensions, tile layout and the offsets of its tiles). Taking one costs a stat and one small read
(one HEAD and one range GET for a URL), never a read of the whole slide, so a re-run checks every slide
before it skips it as done:

- same size, version and header: the same file; skipping is right.
- another version, size or header at the same location: the slide was replaced (copied over, uploaded
  again); its outputs are made again, never reused.
- the recorded location gone and a file at another location with the same size and header: the slide
  moved (the version of a copy or an upload is new by nature, so it is not compared).

`exists(location)` and `same_file(a, b)` answer for URLs too (`Path(url).exists()` is always False).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from wsi.core.config import Count, config_model
from wsi.storage.urls import is_url, parse_url

#: bytes of the slide's start hashed into its fingerprint (a TIFF's header and first IFDs)
HEADER_BYTES = 1 << 16


@config_model
@dataclass(frozen=True)
class SlideFingerprint:
    """A slide file's identity at one moment, without reading it whole (see the module docstring)."""

    size: Count  # bytes
    version: str  # "mtime:<ns>" for a local file, "etag:<...>" (or generation) for a remote object
    header_sha256: str  # sha256 of the first `header_bytes` bytes ("" when not taken)
    header_bytes: Count = HEADER_BYTES

    def differs(self, other: SlideFingerprint, *, moved: bool = False) -> str:
        """Why `other` (the file now) is not the file this fingerprint was taken of; "" when it is. With
        `moved`, only size and header count (a moved or uploaded copy has a version of its own)."""
        if self.size != other.size:
            return f"its size changed ({self.size} -> {other.size} bytes)"
        both = self.header_sha256 and other.header_sha256 and self.header_bytes == other.header_bytes
        if both and self.header_sha256 != other.header_sha256:
            return (
                f"its first {self.header_bytes} bytes changed (header sha256 {self.header_sha256[:12]}"
                f" -> {other.header_sha256[:12]})"
            )
        if not moved and self.version != other.version:
            return (
                f"it was replaced ({_kind(self.version)} {_short(self.version)} -> {_short(other.version)})"
            )
        return ""

    def as_attrs(self) -> dict[str, str | int]:
        """Flat attributes as tile files and bags store them."""
        return {
            "slide_size": self.size, "slide_version": self.version, "slide_header_sha256": self.header_sha256,
            "slide_header_bytes": self.header_bytes,
        }  # fmt: skip

    @classmethod
    def from_attrs(cls, attrs: dict[str, object]) -> SlideFingerprint | None:
        """The fingerprint stored in a file's attributes (None for files written before it was)."""
        size, version = attrs.get("slide_size"), attrs.get("slide_version")
        if size is None or not isinstance(version, str):
            return None
        try:
            return cls(
                size=int(size),  # type: ignore[call-overload]
                version=version,
                header_sha256=str(attrs.get("slide_header_sha256") or ""),
                header_bytes=int(attrs.get("slide_header_bytes") or HEADER_BYTES),  # type: ignore[call-overload]
            )
        except (TypeError, ValueError):
            return None


def _kind(version: str) -> str:
    return {"mtime": "modified", "etag": "ETag", "generation": "generation"}.get(
        version.split(":", 1)[0], "version"
    )


def _short(version: str) -> str:
    value = version.split(":", 1)[-1]
    if version.startswith("mtime:"):
        try:
            import time

            ns = int(value)
            return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9)) + f".{ns % 10**9:09d}"[:4]
        except ValueError:
            return value
    return value[:16]


def fingerprint(location: str | os.PathLike[str], *, header: bool = True) -> SlideFingerprint:
    """The fingerprint of the slide at `location` now (OSError / StorageError when it cannot be read).
    `header=False` leaves out the header's hash: a look at size and version only (one stat or HEAD)."""
    text = os.fspath(location)
    if is_url(text):
        return _remote(text, header=header)
    path = Path(text)
    if path.is_dir():  # a slide kept as a folder (DICOM series given as its folder): its files' stats
        return _folder(path)
    st = path.stat()
    digest = ""
    if header:
        with open(path, "rb") as fh:
            digest = hashlib.sha256(fh.read(HEADER_BYTES)).hexdigest()
    return SlideFingerprint(st.st_size, f"mtime:{st.st_mtime_ns}", digest)


def _folder(path: Path) -> SlideFingerprint:
    items = sorted((p.relative_to(path).as_posix(), p.stat()) for p in path.rglob("*") if p.is_file())
    listing = "\n".join(f"{rel}\t{st.st_size}\t{st.st_mtime_ns}" for rel, st in items)
    size = sum(st.st_size for _, st in items)
    return SlideFingerprint(size, "mtime:" + hashlib.sha256(listing.encode()).hexdigest()[:32], "")


def _remote(text: str, *, header: bool) -> SlideFingerprint:
    from wsi.storage.fs import filesystem, remote_info, translated

    url = parse_url(text, what="slide")
    fs, path = filesystem(url)
    with translated(url, "looking at the slide"):
        fs.invalidate_cache(path)  # the object as it is now, never a listing remembered from before
        data = fs.info(path)
        info = remote_info(fs, path, data)
        digest = ""
        if header:
            digest = hashlib.sha256(fs.cat_file(path, start=0, end=min(HEADER_BYTES, info.size))).hexdigest()
    kind = "generation" if data.get("generation") and not data.get("ETag") else "etag"
    return SlideFingerprint(info.size, f"{kind}:{info.version}", digest)


def exists(location: str | os.PathLike[str]) -> bool:
    """Whether a file (or folder) is at `location`, a local path or a URL (False when it cannot be asked:
    a missing bucket, refused credentials)."""
    text = os.fspath(location)
    if not is_url(text):
        return Path(text).exists()
    from wsi.storage.fs import filesystem

    try:
        url = parse_url(text, what="slide")
        fs, path = filesystem(url)
        fs.invalidate_cache(path)
        return bool(fs.exists(path))
    except Exception:
        return False


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether `a` and `b` name one file: equal locations, or one local file reached by two paths."""
    ta, tb = os.fspath(a), os.fspath(b)
    if ta == tb:
        return True
    if is_url(ta) or is_url(tb):
        return ta.rstrip("/") == tb.rstrip("/")
    try:
        return os.path.samefile(ta, tb)
    except OSError:
        return False


def current_fingerprint(location: str | os.PathLike[str]) -> SlideFingerprint | None:
    """`fingerprint(location)`, or None when it cannot be taken (gone, unreadable): the caller's open of
    the slide then says why, naming it."""
    from wsi.core.errors import WsiError

    try:
        return fingerprint(location)
    except (OSError, WsiError):
        return None


__all__ = ["HEADER_BYTES", "SlideFingerprint", "current_fingerprint", "exists", "fingerprint", "same_file"]

"""One fsspec filesystem per URL scheme, and every storage failure as one clear StorageError.

Credentials and endpoints are never ours: s3fs reads AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
AWS_PROFILE, the instance role and AWS_ENDPOINT_URL (MinIO, moto, Ceph) through botocore; gcsfs reads
GOOGLE_APPLICATION_CREDENTIALS; fsspec's own `FSSPEC_<PROTOCOL>_<OPTION>` variables and config files
reach every scheme. fsspec keeps one filesystem instance per process and options, so the many opens of a
run share its connection pool; a dask worker process makes its own from the same environment.

`storage_error(exc, url, doing)` turns what a storage library raises (FileNotFoundError for a missing
bucket or key, PermissionError for refused credentials, botocore's NoCredentialsError, connection
errors) into a message that names the URL, what was being done and the fix, with any secret masked.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from wsi.core.errors import StorageError
from wsi.storage.urls import Url, credential_hint, redact

#: scheme -> the package fsspec needs for it (named in the error when it is missing)
PACKAGES = {
    "s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
    "abfss": "adlfs", "http": "aiohttp", "https": "aiohttp",
}  # fmt: skip
_CONNECTION = ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ConnectionError",
               "ServerDisconnectedError", "ReadTimeoutError")  # fmt: skip
_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError")


def filesystem(url: Url) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for `url`; StorageError when its library is not installed."""
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(str(url))
    except (ImportError, ValueError) as exc:
        package = PACKAGES.get(url.scheme)
        if package is None and isinstance(exc, ValueError):
            raise StorageError(
                f"{url}: no storage library knows the scheme {url.scheme}:// ({exc})"
            ) from None
        raise StorageError(
            f"{url}: reading {url.scheme}:// needs {package or 'its fsspec library'}: "
            "pip install 'wsi[cloud]' (s3fs; gcsfs for gs://, adlfs for az://)"
        ) from None
    return fs, str(path)


def endpoint(url: Url) -> str:
    """Where `url` is served from, for messages: the S3 endpoint variable, or the host."""
    if url.scheme in ("s3", "s3a"):
        given = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return redact(given) if given else "AWS S3"
    return url.split("://", 1)[1].split("/", 1)[0]


def bucket_of(url: Url) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]


def storage_error(exc: BaseException, url: Url, doing: str) -> StorageError:
    """A user's message for a storage failure of `doing` (e.g. "reading the slide") at `url`."""
    if isinstance(exc, StorageError):
        return exc
    name = type(exc).__name__
    text = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else name)
    where = f"{url} ({endpoint(url)})"
    if name in _NO_CREDENTIALS:
        return StorageError(f"{where}: no credentials found while {doing}; {credential_hint(url.scheme)}")
    if isinstance(exc, PermissionError) or "Forbidden" in text or "AccessDenied" in text:
        return StorageError(
            f"{where}: access denied while {doing} ({text}): the credentials are wrong, expired or not "
            f"allowed this bucket; {credential_hint(url.scheme)}"
        )
    if isinstance(exc, FileNotFoundError):
        if "bucket" in text.lower() and ("not exist" in text.lower() or "NoSuchBucket" in text):
            return no_bucket(url, doing)
        return StorageError(f"{url}: not found while {doing}")
    if name in _CONNECTION or isinstance(exc, ConnectionError) or getattr(exc, "errno", None) in (
        errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ETIMEDOUT,
    ):  # fmt: skip
        return StorageError(
            f"{where}: cannot reach the storage server while {doing} ({text}); check the network and the "
            "endpoint (AWS_ENDPOINT_URL)"
        )
    return StorageError(f"{where}: {doing} failed ({name}: {text})")


def no_bucket(url: Url, doing: str) -> StorageError:
    return StorageError(
        f"{url} ({endpoint(url)}): the bucket {bucket_of(url)!r} does not exist (while {doing}); check its "
        "name and the endpoint (AWS_ENDPOINT_URL for a server other than AWS)"
    )


@contextmanager
def translated(url: Url, doing: str) -> Iterator[None]:
    """Run a storage call; whatever it raises comes out as `storage_error` (KeyboardInterrupt passes)."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        raise storage_error(exc, url, doing) from None


@dataclass(frozen=True)
class RemoteInfo:
    """What is known of a remote file without reading it: its size and a version that changes with it."""

    size: int
    version: str


def remote_info(fs: Any, path: str, info: dict[str, Any] | None = None) -> RemoteInfo:
    """Size and version (ETag, generation, or size + mtime) of a file from fsspec's `info` mapping."""
    data = info if info is not None else fs.info(path)
    version = next(
        (str(data[k]) for k in ("ETag", "etag", "generation", "md5Hash", "VersionId") if data.get(k)),
        f"{data.get('size')}-{data.get('LastModified') or data.get('mtime') or data.get('created')}",
    )
    return RemoteInfo(int(data.get("size") or 0), version.strip('"'))


def list_files(url: Url, *, suffixes: tuple[str, ...] = (), doing: str = "listing") -> dict[str, RemoteInfo]:
    """Every file under the folder `url` (recursively): path relative to it -> RemoteInfo. Hidden and
    temporary names (a part starting with '.') are left out. {} when the folder does not exist yet; a
    missing bucket or refused credentials raise StorageError."""
    fs, root = filesystem(url)
    root = root.rstrip("/")
    with translated(url, doing):
        fs.invalidate_cache(root)  # another process (a dask worker) may have written since
        if not fs.exists(root):
            _check_bucket(fs, url, doing)
            return {}
        found = fs.find(root, detail=True)
    out: dict[str, RemoteInfo] = {}
    for path, info in found.items():
        rel = str(path)[len(root) :].lstrip("/")
        if not rel or info.get("type") == "directory" or any(p.startswith(".") for p in rel.split("/")):
            continue
        if suffixes and not rel.lower().endswith(suffixes):
            continue
        out[rel] = remote_info(fs, path, info)
    return out


def _check_bucket(fs: Any, url: Url, doing: str) -> None:
    """A folder that does not exist is fine (nothing there yet); its bucket must (and be readable)."""
    if url.scheme in ("http", "https"):
        return
    try:
        fs.info(bucket_of(url))  # one request, however many objects the bucket holds
    except FileNotFoundError:
        raise no_bucket(url, doing) from None
    except Exception as exc:
        raise storage_error(exc, url, doing) from None


__all__ = [
    "PACKAGES", "RemoteInfo", "bucket_of", "endpoint", "filesystem", "list_files", "remote_info",
    "storage_error", "translated",
]  # fmt: skip

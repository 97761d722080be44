"""One writer per remote output folder, across machines: a lock object beside the outputs.

A local flock guards a folder on one machine only; two machines writing one `s3://` run each have
their own mirror, and without this both finish with exit 0 while the remote manifest or run folder
becomes a mix of the two. So a command that writes into a remote folder first creates
`<url>/.wsi-lock` with a conditional write (S3 `If-None-Match: *`: the server refuses it when the
object exists, so of two machines exactly one succeeds), holding its owner (a random token, host,
pid, command line, start time) and a lease. While the command runs, a thread renews the lease by
rewriting the object under `If-Match: <its ETag>` (a write that fails when anyone else changed it). The
lock is released by a delete under the same condition.

A second writer is refused with `OutputLockedError`, naming the holder and when its lease ends. A lock
whose lease has run out (its holder was killed or lost its network) is taken over with a conditional
overwrite of the very version that was judged stale, so of two takers one wins. Expiry is judged on the
server's clock (the lock's Last-Modified against the Date of the server's answer), so machines whose
clocks disagree still agree on it; a holder on this host whose process is gone is taken over at once.

Taking the lock also clears what killed uploads of earlier runs left (`.NAME.tmp-*` objects, and on S3
unfinished multipart uploads): no writer is running then, so none of them can be in progress.

The same is done on other stores without the S3 conditions (gs://, az://, https://) by write and read
back, which narrows but does not close the window between two writers; docs/storage.md says so.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wsi.core.errors import OutputLockedError, StorageError
from wsi.storage.fs import filesystem, storage_error, translated
from wsi.storage.settings import storage_settings
from wsi.storage.urls import Url, join

log = logging.getLogger("wsi.storage")

LOCK_KEY = ".wsi-lock"
_CONDITIONAL = ("s3", "s3a")


@dataclass(frozen=True)
class LockState:
    """The lock object as read: its holder's record, version and age on the server's clock."""

    holder: dict[str, Any]
    etag: str
    age_s: float  # seconds since the holder last wrote it, by the server's clock


def lock_url(folder: Url) -> Url:
    return join(folder, LOCK_KEY)


def describe_holder(holder: dict[str, Any], *, lease_left: float | None = None) -> str:
    started = holder.get("started")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started))
        if isinstance(started, int | float)
        else "?"
    )
    text = (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, `{holder.get('command') or '?'}`, "
        f"since {when}"
    )
    if lease_left is not None:
        text += f"; its lease runs out in {max(0.0, lease_left):.0f} s unless renewed"
    return text


class RemoteLock:
    """The lock of the remote folder `url` (see the module docstring); `acquire()`, then `release()`."""

    def __init__(self, url: Url, command: str, *, lease_s: float | None = None) -> None:
        self.url = Url(str(url).rstrip("/"))
        self.command = command
        self.lease_s = float(lease_s if lease_s is not None else storage_settings().lock_lease_s)
        self.fs, root = filesystem(self.url)
        self.key = f"{root.rstrip('/')}/{LOCK_KEY}"
        self.token = uuid.uuid4().hex
        self.etag = ""
        self.lost = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------ storage
    def _body(self) -> bytes:
        record = {
            "token": self.token, "pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
            "started": getattr(self, "_started", time.time()), "lease_s": self.lease_s,
            "renewed": time.time(),
        }  # fmt: skip
        self._started = record["started"]
        return (json.dumps(record) + "\n").encode()

    def _bucket_key(self) -> tuple[str, str]:
        bucket, _, key = self.key.partition("/")
        return bucket, key

    def _put(self, *, if_none_match: bool = False, if_match: str = "") -> str | None:
        """Write our record; its ETag, or None when the condition failed."""
        body = self._body()
        if self.url.scheme not in _CONDITIONAL:
            return self._put_plain(body, if_none_match=if_none_match, if_match=if_match)
        bucket, key = self._bucket_key()
        cond = {"IfNoneMatch": "*"} if if_none_match else ({"IfMatch": if_match} if if_match else {})
        try:
            out = self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, **cond)
        except Exception as exc:
            if _precondition_failed(exc):
                return None
            raise storage_error(exc, lock_url(self.url), "writing the output folder's lock") from None
        self.fs.invalidate_cache(self.key)
        return str(out.get("ETag", "")).strip('"')

    def _put_plain(self, body: bytes, *, if_none_match: bool, if_match: str) -> str | None:
        """Stores without conditional writes: check, write, read back (a narrower window, not none)."""
        state = self.read()
        if if_none_match and state is not None:
            return None
        if if_match and (state is None or state.etag != if_match):
            return None
        with translated(lock_url(self.url), "writing the output folder's lock"):
            self.fs.pipe_file(self.key, body)
        time.sleep(0.2)
        after = self.read()
        if after is None or after.holder.get("token") != self.token:
            return None
        return after.etag

    def read(self) -> LockState | None:
        """The lock object as it is now (None: there is none)."""
        try:
            if self.url.scheme in _CONDITIONAL:
                from fsspec.asyn import sync

                bucket, key = self._bucket_key()
                out, body = sync(self.fs.loop, _get_object, self.fs, bucket, key)
                etag = str(out.get("ETag", "")).strip('"')
                modified = out.get("LastModified")
                date = out.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
                now = email.utils.parsedate_to_datetime(date).timestamp() if date else time.time()
                age = now - modified.timestamp() if modified is not None else 0.0
            else:
                self.fs.invalidate_cache(self.key)
                info = self.fs.info(self.key)
                body = self.fs.cat_file(self.key)
                etag = str(info.get("ETag") or info.get("etag") or info.get("generation") or body).strip('"')
                holder = _parse(body)
                age = time.time() - float(holder.get("renewed") or 0)
                return LockState(holder, etag, age)
        except FileNotFoundError:
            return None
        except Exception as exc:
            if "NoSuchKey" in str(exc) or "Not Found" in str(exc):
                return None
            raise storage_error(exc, lock_url(self.url), "reading the output folder's lock") from None
        return LockState(_parse(body), etag, age)

    def _delete(self, etag: str) -> None:
        with contextlib.suppress(Exception):
            if self.url.scheme in _CONDITIONAL:
                bucket, key = self._bucket_key()
                self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=etag)
            else:
                state = self.read()
                if state is not None and state.holder.get("token") == self.token:
                    self.fs.rm_file(self.key)
            self.fs.invalidate_cache(self.key)

    # ------------------------------------------------------------------------------------ protocol
    def acquire(self) -> None:
        """Take the lock (OutputLockedError naming the holder when another live writer has it)."""
        for _ in range(5):
            etag = self._put(if_none_match=True)
            if etag is not None:
                self.etag = etag
                break
            state = self.read()
            if state is None:
                continue  # released between our write and our read: try again
            if not self._stale(state):
                raise OutputLockedError(self._locked_message(state))
            etag = self._put(if_match=state.etag)
            if etag is not None:
                log.info(
                    "%s: taking over the lock left by %s (%s)", self.url, describe_holder(state.holder),
                    "its process is gone" if _dead_here(state.holder) else
                    f"not renewed for {state.age_s:.0f} s, lease {state.holder.get('lease_s', '?')} s",
                )  # fmt: skip
                self.etag = etag
                break
        else:
            state = self.read()
            raise OutputLockedError(
                self._locked_message(state) if state else f"{self.url}: cannot take its lock"
            )
        self._thread = threading.Thread(target=self._renew_loop, name="wsi-remote-lock", daemon=True)
        self._thread.start()
        clean_partial_uploads(self.url)

    def _stale(self, state: LockState) -> bool:
        if state.holder.get("token") == self.token:
            return True
        if _dead_here(state.holder):
            return True
        lease = state.holder.get("lease_s")
        lease = float(lease) if isinstance(lease, int | float) else self.lease_s
        return state.age_s > lease

    def _locked_message(self, state: LockState) -> str:
        lease = state.holder.get("lease_s")
        left = float(lease) - state.age_s if isinstance(lease, int | float) else None
        return (
            f"{self.url} is in use by another wsi command "
            f"({describe_holder(state.holder, lease_left=left)}): "
            "one command at a time writes into an output folder, from any machine. Wait for it to finish or "
            f"choose another --out; a lock left by a killed run is taken over once its lease runs out (or "
            f"remove {lock_url(self.url)} if you are sure that run is gone)"
        )

    def _renew_loop(self) -> None:
        interval = max(0.5, self.lease_s / 4)
        while not self._stop.wait(interval):
            try:
                etag = self._put(if_match=self.etag)
            except StorageError as exc:  # the network may come back before the lease ends
                log.warning("%s: could not renew the output folder's lock: %s", self.url, exc)
                continue
            if etag is None:
                state = self.read()
                who = describe_holder(state.holder) if state else "nobody (it was removed)"
                self.lost = f"the lock of {self.url} was taken by {who} while this command was writing"
                log.error("%s; outputs written from now on may mix with theirs", self.lost)
                return
            self.etag = etag

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.etag and not self.lost:
            self._delete(self.etag)


async def _get_object(fs: Any, bucket: str, key: str) -> tuple[dict[str, Any], bytes]:
    """One GET: the object's body with its ETag, Last-Modified and the server's Date, all of one version."""
    out = await fs._call_s3("get_object", Bucket=bucket, Key=key)
    async with out["Body"] as stream:
        body = await stream.read()
    return out, body


def _parse(body: bytes | str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _dead_here(holder: dict[str, Any]) -> bool:
    """The holder ran on this host and its process is gone."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _precondition_failed(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, FileExistsError):
            return True
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                return True
        if "pre-condition" in str(seen) or "PreconditionFailed" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def clean_partial_uploads(url: Url) -> int:
    """Remove what killed uploads left under `url`: `.NAME.tmp-*` objects and (S3) unfinished multipart
    uploads. Call only while holding the folder's lock. Returns how many were removed."""
    fs, root = filesystem(url)
    root = root.rstrip("/")
    removed = 0
    try:
        fs.invalidate_cache(root)
        found = fs.find(root, withdirs=False) if fs.exists(root) else []
    except Exception as exc:
        log.debug("%s: could not list for leftover uploads: %s", url, exc)
        return 0
    for path in found:
        if ".tmp-" in str(path).rsplit("/", 1)[-1] and str(path).rsplit("/", 1)[-1].startswith("."):
            with contextlib.suppress(Exception):
                fs.rm_file(path)
                removed += 1
    if url.scheme in _CONDITIONAL:
        bucket, _, prefix = root.partition("/")
        with contextlib.suppress(Exception):
            out = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix)
            for upload in out.get("Uploads", []):
                fs.call_s3(
                    "abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                removed += 1
    if removed:
        log.info("%s: removed %d partial upload(s) left by an interrupted run", url, removed)
    return removed


def default_command() -> str:
    args = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else ["python"]
    text = " ".join(args)
    return text if len(text) <= 300 else text[:297] + "..."


__all__ = [
    "LOCK_KEY", "LockState", "OutputLockedError", "RemoteLock", "clean_partial_uploads", "describe_holder",
    "lock_url",
]  # fmt: skip

"""Connections of `wsi view` read to the end of their request head before a worker thread sees them.

A pool that takes each connection as accepted is frozen by as many idle sockets, byte-a-second clients
or non-HTTP probes as it has threads. Here one selector thread (`HeadReader`) holds every new connection,
never blocking on one, until its request head is complete; only then is it handed to the pool with the
bytes read so far. A head not finished within HEAD_TIMEOUT_S is closed (408), one outgrowing
MAX_HEAD_BYTES answered 414 (request line) or 431 (headers), and at most MAX_PENDING wait (the oldest is
dropped), so a bad connection costs a socket and a buffer, never a worker. Workers write with a socket
timeout (IO_TIMEOUT_S): a client that stops reading holds one that long at most.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: seconds a connection may take from accept to the end of its request head (slowloris, idle sockets)
HEAD_TIMEOUT_S = 10.0
#: bytes of request line and headers (a browser sends under 2 KB; http.server's own line limit is 64 KiB)
MAX_HEAD_BYTES = 16 * 1024
#: connections waiting for their head at once; beyond it the one waiting longest is dropped
MAX_PENDING = 256
#: seconds a worker waits on a socket that does not take (or give) bytes
IO_TIMEOUT_S = 20.0

#: called on a worker thread with (socket, client address, request head bytes)
Dispatch = Callable[[socket.socket, Any, bytes], None]


@dataclass
class _Pending:
    sock: socket.socket
    address: Any
    deadline: float
    head: bytearray = field(default_factory=bytearray)


class HeadReader:
    """The selector thread described in the module docstring; `add` takes an accepted connection."""

    def __init__(
        self,
        dispatch: Dispatch,
        *,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        max_head_bytes: int = MAX_HEAD_BYTES,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self._dispatch = dispatch
        self._timeout = head_timeout_s
        self._max_head = max_head_bytes
        self._max_pending = max_pending
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._new: queue.SimpleQueue[tuple[socket.socket, Any]] = queue.SimpleQueue()
        self._pending: dict[socket.socket, _Pending] = {}  # insertion order = arrival order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wsi-view-heads", daemon=True)
        self._thread.start()

    def add(self, sock: socket.socket, address: Any) -> None:
        """Take an accepted connection (from any thread); its head is read on the selector thread."""
        self._new.put((sock, address))
        self._wake()

    def close(self) -> None:
        """Stop the thread and close every connection still waiting for its head."""
        self._stop.set()
        self._wake()
        self._thread.join(timeout=5)
        for pending in list(self._pending.values()):
            self._drop(pending)
        while not self._new.empty():
            _close(self._new.get_nowait()[0])
        self._selector.close()
        _close(self._wake_r)
        _close(self._wake_w)

    @property
    def n_pending(self) -> int:
        return len(self._pending)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (already woken) or closed
            self._wake_w.send(b"\0")

    def _run(self) -> None:
        while not self._stop.is_set():
            soonest = min((p.deadline for p in self._pending.values()), default=time.monotonic() + 1.0)
            for key, _ in self._selector.select(timeout=min(max(0.05, soonest - time.monotonic()), 1.0)):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                    continue
                self._read(key.data)
            self._take_new()
            self._expire()

    def _take_new(self) -> None:
        while not self._new.empty():
            sock, address = self._new.get_nowait()
            try:
                sock.setblocking(False)
                pending = _Pending(sock, address, time.monotonic() + self._timeout)
                self._selector.register(sock, selectors.EVENT_READ, pending)
            except (OSError, ValueError):  # closed before we saw it
                _close(sock)
                continue
            self._pending[sock] = pending
            while len(self._pending) > self._max_pending:
                oldest = next(iter(self._pending.values()))
                log.debug(
                    "dropping %s: %d connections wait for their request", oldest.address, len(self._pending)
                )
                self._drop(oldest)

    def _expire(self) -> None:
        now = time.monotonic()
        for pending in [p for p in self._pending.values() if p.deadline <= now]:
            log.debug("closing %s: no complete request in %.0f s", pending.address, self._timeout)
            self._answer(pending, 408, "Request Timeout", "no complete request in time")

    def _read(self, pending: _Pending) -> None:
        try:
            chunk = pending.sock.recv(self._max_head + 1 - len(pending.head))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(pending)
            return
        if not chunk:  # the client closed without a whole request
            self._drop(pending)
            return
        pending.head += chunk
        end = _head_end(pending.head)
        if end is not None:
            self._forget(pending)
            try:
                pending.sock.setblocking(True)
                pending.sock.settimeout(IO_TIMEOUT_S)
            except OSError:
                _close(pending.sock)
                return
            self._dispatch(pending.sock, pending.address, bytes(pending.head[:end]))
        elif len(pending.head) > self._max_head:
            line_done = b"\n" in pending.head
            code, reason = (431, "Request Header Fields Too Large") if line_done else (414, "URI Too Long")
            self._answer(pending, code, reason, f"a request head is at most {self._max_head} bytes")

    def _answer(self, pending: _Pending, code: int, reason: str, why: str) -> None:
        """A short error answer, sent without waiting (whatever the socket takes), then close."""
        body = f"{why}\n".encode()
        head = (f"HTTP/1.0 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()  # fmt: skip
        with contextlib.suppress(OSError):
            pending.sock.send(head + body)
        self._drop(pending)

    def _forget(self, pending: _Pending) -> None:
        self._pending.pop(pending.sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(pending.sock)

    def _drop(self, pending: _Pending) -> None:
        self._forget(pending)
        _close(pending.sock)


def _head_end(data: bytearray) -> int | None:
    """Index just past the blank line that ends a request head, or None while it has not come."""
    for sep in (b"\r\n\r\n", b"\n\n"):
        at = data.find(sep)
        if at >= 0:
            return at + len(sep)
    return None


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


__all__ = ["HEAD_TIMEOUT_S", "IO_TIMEOUT_S", "MAX_HEAD_BYTES", "MAX_PENDING", "HeadReader"]

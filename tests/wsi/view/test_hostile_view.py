"""`wsi view` under hostile clients, over real sockets: idle connections, slow senders, non-HTTP bytes and
overlong URLs or headers must never keep a real request from its answer, and get a 4xx, never a 500.

The server runs in this process with as few workers as the probes outnumber (2) and a short head
timeout (1 s), so each probe would have frozen the old server (one worker per accepted connection).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from view_folder import MPP, SIDE_UM, build_folder

from wsi.view import make_server
from wsi.view.connections import MAX_HEAD_BYTES, MAX_PENDING
from wsi.view.server import MAX_URL_CHARS

WORKERS = 2
PROBES = 3 * WORKERS  # more hostile connections than workers


@pytest.fixture(scope="module")
def folder(make_slide: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    box = (0, 0, SIDE_UM, SIDE_UM)
    slide = make_slide(name="hostile-view", size_um=SIDE_UM, mpp=MPP, tissue_boxes_um=[box], blur_boxes_um=[])
    return build_folder(tmp_path_factory.mktemp("hostile-view"), slide.path)


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[tuple[str, int]]:
    srv = make_server(folder, port=0, workers=WORKERS, head_timeout_s=1.0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[0], srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def real_request(server: tuple[str, int], path: str = "/api/slides") -> tuple[int, bytes]:
    """A well-behaved client's GET; its 10 s timeout fails the test where the server is frozen."""
    conn = http.client.HTTPConnection(*server, timeout=10)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        return res.status, res.read()
    finally:
        conn.close()


def raw(server: tuple[str, int], data: bytes, *, timeout: float = 10) -> bytes:
    """Send `data` on a new connection and read the answer until the server closes it."""
    with socket.create_connection(server, timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else -1


def test_idle_connections_do_not_block_a_request(server: tuple[str, int]) -> None:
    with ExitStack() as stack:
        idle = [stack.enter_context(socket.create_connection(server, timeout=10)) for _ in range(PROBES)]
        status, body = real_request(server)
        assert status == 200 and b"slides" in body
        # and the idle ones are closed by the server once their head is overdue (408), not held forever
        answer = idle[0].recv(4096)
        assert answer == b"" or status_of(answer) == 408


def test_slow_senders_do_not_block_a_request(server: tuple[str, int]) -> None:
    stop = threading.Event()

    def drip() -> None:  # slowloris: a valid request head that never ends, a byte every 0.2 s
        head = b"GET /api/slides HTTP/1.0\r\nHost: 127.0.0.1\r\n" + b"X-Slow: 1\r\n" * 1000
        with socket.create_connection(server, timeout=10) as sock:
            for byte in head:
                if stop.is_set():
                    return
                try:
                    sock.send(bytes([byte]))
                except OSError:  # the server gave up on us: what it should do
                    return
                time.sleep(0.2)

    threads = [threading.Thread(target=drip, daemon=True) for _ in range(PROBES)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)  # every dripping connection accepted and sending
        status, _ = real_request(server)
        assert status == 200
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(11, 64)),
        b"\x00" * 512,
        b"SSH-2.0-OpenSSH_9.6\r\n",
    ],
    ids=["tls-hello", "zeros", "ssh"],
)
def test_non_http_bytes_do_not_block_a_request(server: tuple[str, int], garbage: bytes) -> None:
    with ExitStack() as stack:
        for _ in range(PROBES):
            sock = stack.enter_context(socket.create_connection(server, timeout=10))
            sock.sendall(garbage)
        status, _ = real_request(server)
        assert status == 200


def test_garbage_that_ends_like_a_head_gets_400(server: tuple[str, int]) -> None:
    # http.server answers a line that is no request line the HTTP/0.9 way: the error page, no status line
    assert b"400 - Bad request syntax" in raw(server, b"\x01\x02 nonsense \xff\r\n\r\n")
    assert b"400 - Bad request" in raw(server, b"GET / FOO/1.0\r\n\r\n")


@pytest.mark.parametrize("length", [MAX_URL_CHARS + 1, 10_000, 70_000])
def test_long_urls_get_414_never_500(server: tuple[str, int], length: int) -> None:
    path = "/" + "a" * (length - 1)
    answer = raw(server, f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
    assert status_of(answer) == 414, answer[:200]
    long_segment = "/" + "b" * 300 + ".png"  # one name longer than the file system takes (255): 404
    status, _ = real_request(server, long_segment)
    assert status == 404


def test_overlong_headers_get_431(server: tuple[str, int]) -> None:
    headers = "".join(f"X-Pad-{i}: {'x' * 1000}\r\n" for i in range(MAX_HEAD_BYTES // 1000 + 2))
    answer = raw(server, f"GET /api/slides HTTP/1.0\r\nHost: 127.0.0.1\r\n{headers}\r\n".encode())
    assert status_of(answer) == 431


def test_a_flood_of_connections_is_bounded(server: tuple[str, int]) -> None:
    """More pending connections than MAX_PENDING: the oldest are dropped, a new request is answered."""
    with ExitStack() as stack:
        socks = []
        for _ in range(MAX_PENDING + 8):
            try:
                socks.append(stack.enter_context(socket.create_connection(server, timeout=10)))
            except OSError:  # the listen backlog is full: the flood is bounded before it reaches us
                break
        status, _ = real_request(server)
        assert status == 200
        for sock in socks[:8]:  # the oldest: dropped (or, by now, timed out), never left hanging
            try:
                answer = sock.recv(64)
            except ConnectionResetError:
                answer = b""
            assert answer == b"" or status_of(answer) == 408

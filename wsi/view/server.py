"""The HTTP server of `wsi view`: read-only, local by default, serving one folder and its slides.

Why the standard library's `http.server`: the viewer answers a handful of GET routes for one user on
one machine, so a web framework would add a dependency and nothing the page needs; what it lacks is
added here with care: a bounded thread pool (`PooledHTTPServer`) instead of a thread per connection,
fed only with connections whose request head has arrived (`wsi.view.connections`: idle sockets, slow
senders and non-HTTP bytes never hold a worker, and each socket has a timeout), URLs longer than
MAX_URL_CHARS answered 414, strict paths, a Host check against DNS rebinding, and no write method.

Routes (everything else is 404; methods other than GET and HEAD are 405):

  /                                          the page (static/index.html)
  /static/<file>                             the page's files, OpenSeadragon among them (a fixed list)
  /api/slides                                the slide list with predictions (JSON)
  /api/slides/<id>/overlays                  one slide's overlays (JSON, `wsi.view.overlays`)
  /api/slides/<id>/geojson/<layer>           its QuPath GeoJSON objects (layer: qc | geojson)
  /slides/<id>.dzi                           DeepZoom descriptor
  /slides/<id>_files/<level>/<col>_<row>.jpeg   DeepZoom tile
  /<path>                                    a file under DIR (report.html, qc/*.png, top_tiles/...)

Paths are percent-decoded once; a path whose decoding still holds `%` (double encoding), a backslash,
a NUL, a `.` or `..` segment or a hidden name is refused, and a file is served only when its resolved
path (symlinks followed) lies inside DIR. Slides are named by id only, so no slide path is ever taken
from a URL.
"""

from __future__ import annotations

import io
import json
import logging
import mimetypes
import re
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from wsi.core.config import config_model, setting
from wsi.core.errors import WsiError
from wsi.view.catalog import Catalog, SlideEntry
from wsi.view.connections import HEAD_TIMEOUT_S, IO_TIMEOUT_S, HeadReader
from wsi.view.dzi import DeepZoomCache
from wsi.view.overlays import slide_overlays

log = logging.getLogger(__name__)

#: files under DIR the server hands out, by suffix
SERVED_SUFFIXES = {
    ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".json": "application/json",
    ".geojson": "application/geo+json", ".csv": "text/csv; charset=utf-8",
    ".txt": "text/plain; charset=utf-8", ".html": "text/html; charset=utf-8",
}  # fmt: skip
_TILE = re.compile(r"^/slides/(?P<id>.+)_files/(?P<level>\d{1,3})/(?P<col>\d{1,7})_(?P<row>\d{1,7})\.jpeg$")
_DZI = re.compile(r"^/slides/(?P<id>.+)\.dzi$")
_API_SLIDE = re.compile(r"^/api/slides/(?P<id>[^/]+)/(?P<what>overlays|geojson/(?P<layer>qc|geojson))$")
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
#: the longest URL answered (ours are under 200 characters); longer ones get 414, never a file lookup
MAX_URL_CHARS = 4096
_CSP = "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; object-src 'none'"


def static_files() -> dict[str, Path]:
    """The page's files by URL name (relative posix path under wsi/view/static)."""
    root = Path(str(resources.files("wsi.view") / "static"))
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def clean_path(raw: str) -> str | None:
    """The decoded URL path, or None when it is not one the server will look up."""
    path = raw.split("?", 1)[0].split("#", 1)[0]  # not urlsplit: "//x/y" would lose "x" as a host
    if "\\" in path or "%5c" in path.lower():
        return None
    try:
        decoded = unquote(path, errors="strict")
    except UnicodeDecodeError:
        return None
    if not decoded.startswith("/") or any(c in decoded for c in ("%", "\\", "\x00")):
        return None
    parts = decoded.split("/")[1:]
    if any(p in (".", "..") or p.startswith(".") for p in parts if p):
        return None
    return decoded


class ViewState:
    """What every request shares: the folder's catalog, the open slides, computed overlays."""

    def __init__(self, root: Path, *, backend: str) -> None:
        self.root = root.resolve()
        self.catalog = Catalog(self.root)
        self.backend = backend
        self.deepzoom = DeepZoomCache(backend)
        self.static = static_files()
        self._overlays: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def overlays(self, entry: SlideEntry) -> bytes:
        with self._lock:
            cached = self._overlays.get(entry.slide_id)
        if cached is not None:
            return cached
        from wsi.slides.slide import open_slide

        assert entry.path is not None
        with open_slide(entry.path, backend=self.backend, mpp=entry.mpp) as slide:
            width, height = slide.dimensions
            mpp = slide.mpp
        body = json.dumps(slide_overlays(entry, root=self.root, width=width, height=height, mpp=mpp)).encode()
        with self._lock:
            self._overlays[entry.slide_id] = body
        return body

    def file_under_root(self, path: str) -> Path | None:
        """The regular file under the folder that `path` names, or None (outside, missing, not served)."""
        try:
            target = (self.root / path.lstrip("/")).resolve()
            if not target.is_relative_to(self.root) or not target.is_file():
                return None
        except (OSError, ValueError):  # a name too long for the file system, a NUL: no such file
            return None
        return target if target.suffix.lower() in SERVED_SUFFIXES else None


class ViewHandler(BaseHTTPRequestHandler):
    """GET and HEAD only; every answer has a length, a type and no-sniff, so the browser guesses nothing."""

    server: PooledHTTPServer
    server_version = "wsi-view"
    protocol_version = "HTTP/1.0"
    timeout = IO_TIMEOUT_S  # a client that stops reading its answer frees the worker after this

    def setup(self) -> None:
        # PooledHTTPServer hands over (socket, request head): the head was read by wsi.view.connections
        self.request, head = self.request
        super().setup()
        self.rfile.close()
        self.rfile = io.BytesIO(head)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _refuse(self) -> None:
        self._send(
            HTTPStatus.METHOD_NOT_ALLOWED,
            b"read-only: GET and HEAD only\n",
            "text/plain",
            extra={"Allow": "GET, HEAD"},
        )

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    def _send(self, status: HTTPStatus, body: bytes, ctype: str, *, head: bool = False,
              cache: str = "no-store", extra: dict[str, str] | None = None) -> None:  # fmt: skip
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", cache)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", _CSP)
        self.send_header("Referrer-Policy", "no-referrer")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _not_found(self, head: bool, why: str = "not found") -> None:
        self._send(HTTPStatus.NOT_FOUND, f"{why}\n".encode(), "text/plain; charset=utf-8", head=head)

    def _host_ok(self) -> bool:
        if not self.server.loopback_only:
            return True
        host = (self.headers.get("Host") or "").strip().lower()
        name = (
            host[1:].split("]")[0]
            if host.startswith("[")
            else host.rsplit(":", 1)[0]
            if host.count(":") == 1
            else host
        )
        return name in _LOOPBACK_HOSTS

    def _answer(self, *, head: bool) -> None:
        if len(self.path) > MAX_URL_CHARS:
            msg = f"URL of {len(self.path)} characters; at most {MAX_URL_CHARS}\n".encode()
            self._send(HTTPStatus.REQUEST_URI_TOO_LONG, msg, "text/plain", head=head)
            return
        if not self._host_ok():
            self._send(HTTPStatus.FORBIDDEN, b"unknown Host\n", "text/plain", head=head)
            return
        path = clean_path(self.path)
        if path is None:
            self._not_found(head)
            return
        try:
            self._route(path, head)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away (OpenSeadragon cancels tiles it no longer needs)
        except WsiError as exc:
            self._send(
                HTTPStatus.UNPROCESSABLE_ENTITY, f"{exc}\n".encode(), "text/plain; charset=utf-8", head=head
            )
        except Exception:  # one bad request must not take the server down; the log has the detail
            log.exception("error answering %s", path)
            self._send(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                b"internal error (see the server's log)\n",
                "text/plain",
                head=head,
            )

    def _route(self, path: str, head: bool) -> None:
        state = self.server.state
        if path == "/":
            path = "/static/index.html"
        if path.startswith("/static/"):
            file = state.static.get(path[len("/static/") :])
            if file is None:
                self._not_found(head)
                return
            ctype = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
            self._send(HTTPStatus.OK, file.read_bytes(), ctype, head=head, cache="max-age=300")
            return
        if path == "/api/slides":
            self._send(
                HTTPStatus.OK, json.dumps(state.catalog.listing()).encode(), "application/json", head=head
            )
            return
        if m := _API_SLIDE.match(path):
            entry = state.catalog.get(m["id"])
            if entry is None or entry.path is None:
                self._not_found(head, "no such slide here, or its file is not reachable")
                return
            if m["what"] == "overlays":
                self._send(HTTPStatus.OK, state.overlays(entry), "application/json", head=head)
                return
            layer = entry.geojson.get(m["layer"])
            if layer is None:
                self._not_found(head)
                return
            self._send(HTTPStatus.OK, layer.read_bytes(), "application/geo+json", head=head)
            return
        if path.startswith("/slides/"):
            self._slide(path, head)
            return
        if path.startswith("/api/"):
            self._not_found(head)
            return
        file = state.file_under_root(path)
        if file is None:
            self._not_found(head)
            return
        self._send(HTTPStatus.OK, file.read_bytes(), SERVED_SUFFIXES[file.suffix.lower()], head=head)

    def _slide(self, path: str, head: bool) -> None:
        state = self.server.state
        m = _TILE.match(path) or _DZI.match(path)
        entry = state.catalog.get(m["id"]) if m else None
        if m is None or entry is None or entry.path is None:
            self._not_found(head)
            return
        slide = state.deepzoom.get(entry.path)
        if "level" not in m.groupdict():
            self._send(HTTPStatus.OK, slide.dzi().encode(), "application/xml", head=head)
            return
        try:
            jpeg = slide.tile_jpeg(int(m["level"]), int(m["col"]), int(m["row"]))
        except ValueError:
            self._not_found(head, "no such tile")
            return
        self._send(HTTPStatus.OK, jpeg, "image/jpeg", head=head, cache="max-age=3600")


class PooledHTTPServer(HTTPServer):
    """HTTPServer answering each request on a bounded pool of threads (many parallel tile requests,
    never unbounded threads), once its head has arrived (`wsi.view.connections.HeadReader`)."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a burst of connections waits for accept, not refused

    def __init__(
        self, address: tuple[str, int], state: ViewState, *, workers: int = 8,
        head_timeout_s: float = HEAD_TIMEOUT_S,
    ) -> None:  # fmt: skip
        host = address[0]
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # before binding: a port in use makes HTTPServer call server_close, which closes all of these
        self.state = state
        self.loopback_only = host in ("127.0.0.1", "::1", "localhost")
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wsi-view")
        self.heads = HeadReader(self._submit, head_timeout_s=head_timeout_s)
        super().__init__(address, ViewHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.heads.add(request, client_address)  # to the pool once its request head is here

    def _submit(self, request: socket.socket, client_address: Any, head: bytes) -> None:
        self.pool.submit(self._process, request, client_address, head)

    def _process(self, request: socket.socket, client_address: Any, head: bytes) -> None:
        try:
            self.finish_request((request, head), client_address)  # type: ignore[arg-type]
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        self.heads.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.state.deepzoom.close()


@config_model
@dataclass(frozen=True)
class ViewOptions:
    """Where `wsi view` listens and how many threads answer (the slide reader: TileOptions.backend)."""

    host: str = setting("127.0.0.1", help="Address to listen on (local only by default).")
    port: int = setting(8765, ge=0, le=65535, help="Port (0: any free one).")
    server_threads: int = setting(
        8, ge=1, le=64, help="Threads answering requests (tiles are read in parallel)."
    )


def make_server(root: Path, *, host: str = ViewOptions.host, port: int = 0, backend: str = "openslide",
                workers: int = ViewOptions.server_threads,
                head_timeout_s: float = HEAD_TIMEOUT_S) -> PooledHTTPServer:  # fmt: skip
    """A server for `root` bound to (host, port); port 0 picks a free one (see `server_address`)."""
    state = ViewState(root, backend=backend)
    return PooledHTTPServer((host, port), state, workers=workers, head_timeout_s=head_timeout_s)


__all__ = [
    "SERVED_SUFFIXES", "PooledHTTPServer", "ViewHandler", "ViewOptions", "ViewState", "clean_path",
    "make_server",
]  # fmt: skip

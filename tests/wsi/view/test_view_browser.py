"""`wsi view` in a real browser: headless Chromium (Debian's `chromium`) against a running `wsi view`.

Started as the user starts it (the CLI, in its own process, on a free port), then: the server listens
on 127.0.0.1 only (/proc/net/tcp), path traversal probes are refused, the page lists the slides, the
slide's DeepZoom tiles arrive and are drawn (tissue colours in the screenshot with the heatmap off),
and the heatmap overlay shows where it must (dark red over the left half, dark blue over the right:
the known values of tests/helpers/view_folder.py at full opacity). Skipped when no Chromium is installed
(.ci/run installs it).
"""

from __future__ import annotations

import http.client
import io
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chromium_cdp import Chromium, find_chromium
from PIL import Image
from view_folder import DARK_BLUE, DARK_RED, MPP, SIDE_UM, build_folder

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")

READY = (
    "document.body && document.body.dataset.state === 'ready'"
    " && Number(document.body.dataset.tilesLoaded) > 0"
    " && document.body.dataset.fullyLoaded === 'true' && JSON.stringify(document.body.dataset)"
)


@pytest.fixture(scope="module")
def running_view(make_slide: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    slide = make_slide(name="view", size_um=SIDE_UM, mpp=MPP, tissue_boxes_um=[(0, 0, SIDE_UM, SIDE_UM)],
                       blur_boxes_um=[])  # fmt: skip
    root = tmp_path_factory.mktemp("view-browser")
    folder = build_folder(root, slide.path)
    (root / "outside.txt").write_text("secret", encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from wsi.cli.main import cli; cli()", "view", str(folder), "--port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    port = None
    deadline = time.monotonic() + 60
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        if m := re.search(r"http://127\.0\.0\.1:(\d+)/", line):
            port = int(m[1])
    if port is None:
        proc.kill()
        pytest.fail(f"wsi view did not start: {proc.stderr.read()}")
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def _listening(port: int) -> set[str]:
    """Local addresses listening on `port` (IPv4 and IPv6), from /proc/net/tcp*."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(addr)
    return found


def _status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def _near(pixels: np.ndarray, rgb: tuple[int, int, int], tol: int = 12) -> np.ndarray:
    return np.all(np.abs(pixels.astype(int) - np.array(rgb)) <= tol, axis=-1)


def test_server_listens_on_loopback_only_and_refuses_traversal(running_view: int) -> None:
    if Path("/proc/net/tcp").exists():
        assert _listening(running_view) == {"0100007F"}  # 127.0.0.1, nothing else (no 0.0.0.0, no ::)
    for probe in ("/../outside.txt", "/%2e%2e/outside.txt", "/%252e%252e/outside.txt", "/..%5coutside.txt"):
        assert _status(running_view, probe) in (403, 404), probe
    assert _status(running_view, "/slides/s1.dzi") == 200


def test_page_loads_tiles_arrive_and_the_heatmap_shows(running_view: int, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    base = f"http://127.0.0.1:{running_view}/"
    with Chromium(CHROMIUM, width=900, height=600) as browser:
        browser.goto(base + "?slide=s1&opacity=0")
        # 5-6 s alone or beside three CPU burners on two cores; the wait ends as soon as the page says it
        # is drawn, so its bound only decides when a page that never draws fails (CI: 4 workers, 2 cores)
        state = browser.wait_for(READY, timeout=90)
        assert state, (
            f"the page never drew the slide: {browser.evaluate('JSON.stringify(document.body.dataset)')}"
        )
        rows = browser.evaluate("[...document.querySelectorAll('#slides tbody tr')].map(r => r.dataset.id)")
        assert sorted(rows) == ["gone", "s1"]
        assert "predicted a" in browser.evaluate("document.getElementById('prediction').textContent")
        slide_only = np.asarray(Image.open(io.BytesIO(browser.screenshot())).convert("RGB"))
        # where the slide's level-0 corners are on the screen, as OpenSeadragon placed it
        corners = browser.evaluate(
            "(() => { const osd = document.getElementById('osd').getBoundingClientRect();"
            " const item = viewer.world.getItemAt(0);"
            " const a = item.imageToViewerElementCoordinates(new OpenSeadragon.Point(0, 0));"
            " const b = item.imageToViewerElementCoordinates(new OpenSeadragon.Point(1200, 1200));"
            " return [osd.left + a.x, osd.top + a.y, osd.left + b.x, osd.top + b.y]; })()"
        )

        # the opacity control, moved as a user would: the overlay is redrawn over the same tiles
        browser.evaluate("(() => { const o = document.getElementById('opacity'); o.value = '1';"
                         " o.dispatchEvent(new Event('input')); })()")  # fmt: skip
        assert int(browser.evaluate("document.body.dataset.heatDrawn")) == 36
        with_heat = np.asarray(Image.open(io.BytesIO(browser.screenshot())).convert("RGB")).copy()
        legend = browser.evaluate(
            "(() => { const r = document.getElementById('legend').getBoundingClientRect();"
            " return [r.left, r.top, r.right, r.bottom]; })()"
        )
    # the legend box sits over the slide's corner: painted the expected colour so it counts as neither
    lx0, ly0, lx1, ly1 = (round(v) for v in legend)
    h, w = with_heat.shape[:2]
    x0, y0, x1, y1 = (
        max(0, round(corners[0])),
        max(0, round(corners[1])),
        min(w, round(corners[2])),
        min(h, round(corners[3])),
    )
    assert x1 - x0 > 200 and y1 - y0 > 200, corners
    mid, inset = (x0 + x1) // 2, 6
    slide = slide_only[y0 + inset : y1 - inset, x0 + inset : x1 - inset]
    # the slide's tiles: H&E-like tissue (pinkish, darker than the page) covers the slide's place
    pink = (slide[..., 0].astype(int) > slide[..., 1].astype(int) + 15) & (slide.sum(axis=-1) < 650)
    assert pink.mean() > 0.3, f"no slide tiles drawn ({pink.mean():.3f} of the slide tissue-coloured)"
    assert _near(slide, DARK_RED).mean() < 0.01  # with the heatmap off, none of its colour
    # the heatmap: dark red over the left half, dark blue over the right (the known values at opacity 1)
    left = with_heat[y0 + inset : y1 - inset, x0 + inset : mid - inset]
    right = with_heat.copy()
    right[max(0, ly0 - 2) : ly1 + 2, max(0, lx0 - 2) : lx1 + 2] = DARK_BLUE
    right = right[y0 + inset : y1 - inset, mid + inset : x1 - inset]
    assert _near(left, DARK_RED).mean() > 0.95, _near(left, DARK_RED).mean()
    assert _near(right, DARK_BLUE).mean() > 0.95, _near(right, DARK_BLUE).mean()

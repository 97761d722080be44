"""`wsi view`: the catalog of a prediction folder, DeepZoom tiles, overlay JSON, refused paths, the CLI.

The server runs in this process on a free port of 127.0.0.1; requests go through http.client so the
paths reach it byte for byte (urllib would normalise some of the probes away).
"""

from __future__ import annotations

import http.client
import io
import json
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from view_folder import MPP, SIDE_UM, TILE_UM, build_folder, tile_grid

from wsi.core.errors import WsiError
from wsi.formats.tile_values import read_tile_values, write_tile_values
from wsi.view import make_server
from wsi.view.server import clean_path

#: paths that must never reach a file outside the folder: plain, encoded, double-encoded, backslashes
TRAVERSAL_PROBES = [
    "/../../../../etc/passwd", "/..%2f..%2f..%2fetc%2fpasswd", "/%2e%2e/%2e%2e/etc/passwd",
    "/%252e%252e/%252e%252e/etc/passwd", "/..%5c..%5cetc%5cpasswd", "/..\\..\\etc\\passwd",
    "/slides/../manifest.csv", "/slides/..%2fmanifest.csv.dzi", "/static/../../manifest.csv",
    "/static/%2e%2e/viewer.js", "/heatmaps/../../outside.txt", "/outside.txt", "/link/outside.txt",
    "/%2fetc%2fpasswd", "//etc/passwd", "/api/slides/..%2f..%2f/overlays", "/.hidden.json",
    "/slides/s1_files/0/0_0.jpeg/../../../manifest.csv", "/%c0%ae%c0%ae/etc/passwd",
    "/slides/s1_files/99/0_0.jpeg", "/slides/s1_files/0/5_5.jpeg", "/slides/gone.dzi",
]  # fmt: skip


@pytest.fixture(scope="module")
def folder(make_slide: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    slide = make_slide(name="view", size_um=SIDE_UM, mpp=MPP, tissue_boxes_um=[(0, 0, SIDE_UM, SIDE_UM)],
                       blur_boxes_um=[])  # fmt: skip
    root = tmp_path_factory.mktemp("view")
    out = build_folder(root, slide.path)
    (root / "outside.txt").write_text("secret", encoding="utf-8")
    (out / "link").mkdir()
    (out / "link" / "outside.txt").symlink_to(root / "outside.txt")  # a symlink leading out of the folder
    (out / ".hidden.json").write_text("{}", encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[tuple[str, int]]:
    srv = make_server(folder, port=0, workers=8)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[0], srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def get(server: tuple[str, int], path: str, *, method: str = "GET",
        headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:  # fmt: skip
    conn = http.client.HTTPConnection(*server, timeout=30)
    try:
        conn.putrequest(
            method, path, skip_host=headers is not None and "Host" in headers, skip_accept_encoding=True
        )
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        res = conn.getresponse()
        return res.status, res.read(), {k.lower(): v for k, v in res.getheaders()}
    finally:
        conn.close()


def test_slide_list_has_predictions_and_says_why_a_slide_is_missing(server: tuple[str, int]) -> None:
    status, body, headers = get(server, "/api/slides")
    assert status == 200 and headers["content-type"] == "application/json"
    listing = json.loads(body)
    assert listing["kind"] == "predict"
    by_id = {s["id"]: s for s in listing["slides"]}
    expected = {"prob_a": "0.800000", "prob_b": "0.200000", "predicted": "a"}
    assert by_id["s1"]["viewable"] and by_id["s1"]["prediction"] == expected
    assert by_id["s1"]["has_heatmap"] and by_id["s1"]["has_tiles"] and by_id["s1"]["geojson"] == ["qc"]
    assert not by_id["gone"]["viewable"] and "gone.svs not found" in by_id["gone"]["why_missing"]
    assert "/" not in json.dumps(by_id["s1"]).replace("\\/", "")  # no path of this machine leaves the server


def test_dzi_and_tiles_are_the_slide(server: tuple[str, int], folder: Path) -> None:
    status, body, _ = get(server, "/slides/s1.dzi")
    assert status == 200
    image = ET.fromstring(body)
    size = image.find("{http://schemas.microsoft.com/deepzoom/2008}Size")
    assert size is not None and (size.get("Width"), size.get("Height")) == ("1200", "1200")
    assert (image.get("TileSize"), image.get("Overlap"), image.get("Format")) == ("254", "1", "jpeg")
    # level 11 is full resolution (2^11 >= 1200): tile (0, 0) is 254 + 1 px overlap on its right/bottom
    status, body, headers = get(server, "/slides/s1_files/11/0_0.jpeg")
    assert status == 200 and headers["content-type"] == "image/jpeg"
    tile = np.asarray(Image.open(io.BytesIO(body)))
    assert tile.shape == (255, 255, 3)
    assert tile.mean() < 235  # tissue, not blank glass (the whole slide is tissue)
    status, body, _ = get(server, "/slides/s1_files/0/0_0.jpeg")
    assert status == 200 and Image.open(io.BytesIO(body)).size == (1, 1)


def test_parallel_tile_requests_agree_with_sequential_ones(server: tuple[str, int]) -> None:
    paths = [
        f"/slides/s1_files/{lvl}/{c}_{r}.jpeg" for lvl in (9, 10, 11) for c in range(2) for r in range(2)
    ]
    sequential = {p: get(server, p)[1] for p in paths}
    with ThreadPoolExecutor(16) as pool:
        parallel = list(pool.map(lambda p: (p, get(server, p)), paths * 3))
    for p, (status, body, _) in parallel:
        assert status == 200 and body == sequential[p]


def test_overlays_are_in_level0_pixels(server: tuple[str, int]) -> None:
    status, body, _ = get(server, "/api/slides/s1/overlays")
    assert status == 200
    ov = json.loads(body)
    assert (ov["width"], ov["height"], ov["mpp"]) == (1200, 1200, MPP)
    heat = ov["heat"]
    assert heat["size"] == TILE_UM / MPP and heat["predicted"] == "a"
    np.testing.assert_allclose(heat["xy"], tile_grid() / MPP)
    left = np.asarray(heat["xy"])[:, 0] < 600
    assert np.all(np.asarray(heat["outputs"]["a"])[left] == 1.0) and np.all(
        np.asarray(heat["outputs"]["b"])[left] == -1.0
    )
    assert ov["tiles"]["size"] == TILE_UM / MPP and len(ov["tiles"]["xy"]) == 36
    assert [(t["side"], t["x"], t["size"]) for t in ov["top_tiles"]] == [
        ("most", 0, 200),
        ("least", 1000, 200),
    ]
    assert ov["prediction"]["predicted"] == "a" and ov["problems"] == []
    status, body, _ = get(server, "/api/slides/s1/geojson/qc")
    assert (
        status == 200 and json.loads(body)["features"][0]["properties"]["classification"]["name"] == "Tissue"
    )


@pytest.mark.parametrize("probe", TRAVERSAL_PROBES)
def test_paths_outside_the_folder_are_refused(server: tuple[str, int], probe: str) -> None:
    status, body, _ = get(server, probe)
    assert status in (403, 404), (probe, status)
    assert b"secret" not in body and b"root:" not in body


def test_files_under_the_folder_are_served_read_only(server: tuple[str, int]) -> None:
    status, body, _ = get(server, "/manifest.csv")
    assert status == 200 and body.startswith(b"slide,path,status")
    assert get(server, "/static/openseadragon/LICENSE.txt")[0] == 200
    for method in ("POST", "PUT", "DELETE"):
        assert get(server, "/manifest.csv", method=method)[0] == 405
    # DNS rebinding: a page of another site reaching 127.0.0.1 under its own name is refused
    assert get(server, "/api/slides", headers={"Host": "evil.example:80"})[0] == 403
    assert get(server, "/api/slides", headers={"Host": f"localhost:{server[1]}"})[0] == 200


def test_clean_path_decodes_once_and_refuses_tricks() -> None:
    assert clean_path("/slides/s%201.dzi?x=1") == "/slides/s 1.dzi"
    for raw in ("/a/%2e%2e/b", "/a/%252e", "/a\\b", "/a%5cb", "/a/%00", "/a/./b", "/%ff"):
        assert clean_path(raw) is None, raw


def test_tile_values_round_trip_and_refuse_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "v.json"
    write_tile_values(
        path, slide="x", coords_um=[[0, 0], [10, 0]], tile_um=10, outputs={"r": [0.5, np.nan]}
    )
    values = read_tile_values(path)
    assert values.outputs["r"][0] == 0.5 and np.isnan(values.outputs["r"][1]) and values.mpp is None
    with pytest.raises(ValueError, match="1 values for 2 tiles"):
        write_tile_values(path, slide="x", coords_um=[[0, 0], [10, 0]], tile_um=10, outputs={"r": [1.0]})
    path.write_text('{"format": "other"}', encoding="utf-8")
    with pytest.raises(WsiError, match=r"v\.json: unreadable tile values"):
        read_tile_values(path)


def test_cli_refuses_a_folder_without_slides(tmp_path: Path) -> None:
    from wsi.cli.main import cli

    runner = CliRunner()
    result = runner.invoke(cli, ["view", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "no such folder" in result.output
    result = runner.invoke(cli, ["view", str(tmp_path), "--port", "0"])
    assert result.exit_code == 2 and "no slide to show" in result.output
    help_text = runner.invoke(cli, ["view", "--help"]).output
    assert "Examples:" in help_text and "127.0.0.1" in help_text


def test_report_links_each_slide_to_its_view() -> None:
    from wsi.pipelines.report.page import slide_links
    from wsi.pipelines.study.kinds import PredictionSet

    sets = [PredictionSet("test", ["s 1", "s2"], np.zeros((2, 1)), np.zeros((2, 2))),
            PredictionSet("pooled", ["s 1", "s2"], np.zeros((2, 1)), np.zeros((2, 2)))]  # fmt: skip
    kind: Any = SimpleNamespace(task=SimpleNamespace(level="slide", input="bags"))
    html = "".join(slide_links(kind, sets))
    assert html.count("<a ") == 2 and 'href="./?slide=s%201"' in html and 'href="./?slide=s2"' in html
    kind.task.level = "patient"
    assert slide_links(kind, sets) == []


def test_a_tiling_folder_lists_its_slides_with_kept_tiles(
    make_slide: Callable[..., Any], tmp_path: Path
) -> None:
    """What `wsi tile` really writes (tiles/manifest.csv, tiles/<id>.h5, qc/<id>.png) is found, given as
    the run folder or as its tiles/ folder."""
    from wsi.pipelines.tile.stage import tile_slides
    from wsi.slides.sources import find_slides
    from wsi.view import Catalog
    from wsi.view.overlays import kept_tiles

    slide = make_slide(name="view", size_um=SIDE_UM, mpp=MPP, tissue_boxes_um=[(0, 0, SIDE_UM, SIDE_UM)],
                       blur_boxes_um=[])  # fmt: skip
    [result] = tile_slides(find_slides([slide.path]), out_dir=tmp_path)
    assert result.status == "ok"
    for root in (tmp_path, tmp_path / "tiles"):
        catalog = Catalog(root)
        entry = catalog.get("view")
        assert catalog.kind == "tile" and entry is not None and entry.path == slide.path
        assert entry.tile_file == tmp_path / "tiles" / "view.h5"
    assert Catalog(tmp_path).slides["view"].qc_png == tmp_path / "qc" / "view.png"
    tiles = kept_tiles(tmp_path / "tiles" / "view.h5")
    assert len(tiles["xy"]) == result.n > 0 and tiles["size"] > 0


def test_cli_names_a_port_in_use_without_a_traceback(folder: Path) -> None:
    """A port another program holds is a user's choice to change (exit 2, naming it), not a crash."""
    import socket

    from wsi.cli.main import cli

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["view", str(folder), "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert f"cannot listen on 127.0.0.1:{port}" in result.output and "choose another --port" in result.output
    assert not isinstance(result.exception, AttributeError)
